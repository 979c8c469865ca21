"""Gradients of the generated backward kernels at real sizes on a GPU, against autograd through
the float64 reference (computed on the GPU). One line per case; exits 1 if any case fails.

The gate is each gradient's relative error ||g - ref|| / ||ref|| (as bench/gpu_check.py
measures the forward); limits are 2e-2 for fp16/bf16 and 1e-4 for fp32 (issue 4's bounds).
The worst element, |g - ref| / max|ref|, is printed too: for ReLU attention it is larger
because the derivative of relu jumps at s = 0, so scores within rounding of 0 take the other
branch than in the float64 reference.

    python bench/gpu_check_backward.py [--seq 4096] [--only relu]
"""

from __future__ import annotations

import argparse
import sys

import torch

import attnfuse as af
from attnfuse.runtime.reference import gradient_errors, reference_gradients

LIMIT = {torch.float16: 2e-2, torch.bfloat16: 2e-2, torch.float32: 1e-4}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--only", default="", help="run only cases whose spec contains this text")
    parser.add_argument("--head-dims", default="64,128", help="head dims to check (64: H=8/8, 128: H=32/8)")
    args = parser.parse_args()
    n = args.seq
    dev = "cuda"
    torch.manual_seed(0)
    cases = []
    geometries = {64: (64, 8, 8), 128: (128, 32, 8)}
    for d, hq, hkv in (geometries[int(d)] for d in args.head_dims.split(",")):
        for dtype in (torch.float16, torch.bfloat16):
            for placement in ("auto", "fused", "pre_rotated", "q_fused"):
                cases.append((af.attention(af.rope(), af.causal()), d, hq, hkv, n, n, dtype, placement))
            cases.append((af.attention(af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.alibi(), af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.additive_bias(), af.rope()), d, hq, hkv, n // 2, n // 2, dtype, "auto"))
            cases.append((af.attention(af.relu(), af.causal(), af.rope(theta=500000.0, scaling=af.llama3_scaling())), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.relu(), af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.block_sparse(128), af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.block_sparse(64), af.sliding_window(1000), af.alibi()), d, hq, hkv, n - 5, n, dtype, "auto"))
            cases.append((af.attention(af.rope(interleaved=True, rotary_dim=d // 2), af.causal(), af.sliding_window(256)), d, hq, hkv, n, n, dtype, "auto"))
        cases.append((af.attention(af.rope(), af.causal()), d, hq, hkv, n // 4 + 3, n // 4 + 3, torch.float32, "auto"))
        cases.append((af.attention(af.additive_bias(), af.alibi()), d, hq, hkv, n // 8 + 1, n // 8 + 9, torch.float32, "auto"))
    cases = [c for c in cases if args.only in repr(c[0])]
    failures = 0
    for spec, d, hq, hkv, nq, nk, dtype, placement in cases:
        q = torch.randn(1, hq, nq, d, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype, requires_grad=True)
        fn = af.compile(spec, rope_placement=placement)
        data = {}
        if "additive_bias" in repr(spec):
            # Per-head bias, broadcast over the batch: its gradient is reduced over it.
            data["bias"] = torch.randn(hq, nq, nk, device=dev, dtype=torch.float32, requires_grad=True)
        sparse = next((b for b in spec.blocks if type(b).__name__ == "BlockSparse"), None)
        if sparse is not None:
            blocks = (-(-nq // sparse.block_size), -(-nk // sparse.block_size))
            data["block_layout"] = torch.rand(hq, *blocks, device=dev) < 0.4
        out = fn(q, k, v, **data)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        ref = reference_gradients(spec, q, k, v, grad_out, device=dev, **data)
        got = {"q": q.grad, "k": k.grad, "v": v.grad}
        if "bias" in data:
            got["bias"] = data["bias"].grad
        errors = gradient_errors(got, ref)
        worst = {name: (grad.double() - ref[name]).abs().max().item() / max(ref[name].abs().max().item(), 1e-30)
                 for name, grad in got.items()}
        finite = all(torch.isfinite(g).all().item() for g in got.values())
        ok = finite and max(errors.values()) <= LIMIT[dtype]
        failures += not ok
        shown = " ".join(f"d{name} {errors[name]:.1e} (max {worst[name]:.1e})" for name in errors)
        print(f"{'ok  ' if ok else 'FAIL'} {spec!r} D={d} H={hq}/{hkv} N={nq}x{nk} "
              f"{str(dtype)[6:]} {placement}: {shown}", flush=True)
        del q, k, v, out, grad_out, ref, got, data
        torch.cuda.empty_cache()
    print(f"{len(cases) - failures}/{len(cases)} cases within tolerance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
