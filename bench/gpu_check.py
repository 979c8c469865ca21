"""Correctness of the generated kernels at real sizes on a GPU, against the float64 reference
(computed on the GPU). Prints one line per case and exits 1 if any case fails.

    python bench/gpu_check.py [--seq 4096]
"""

from __future__ import annotations

import argparse
import sys

import torch

import attnfuse as af


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq", type=int, default=4096)
    args = parser.parse_args()
    n = args.seq
    dev = "cuda"
    torch.manual_seed(0)
    failures = 0
    cases = []
    for d, hq, hkv in ((64, 8, 8), (128, 32, 8)):
        for dtype in (torch.float16, torch.bfloat16):
            for placement in ("auto", "fused", "pre_rotated", "q_fused"):
                cases.append((af.attention(af.rope(), af.causal()), d, hq, hkv, n, n, dtype, placement))
        cases.append((af.attention(af.causal()), d, hq, hkv, n, n, torch.bfloat16, "auto"))
        cases.append((af.attention(af.rope(interleaved=True, rotary_dim=d // 2), af.causal(), af.sliding_window(256)), d, hq, hkv, n, n, torch.float16, "auto"))
        cases.append((af.attention(af.rope(theta=500000.0), af.causal()), d, hq, hkv, 1, n, torch.bfloat16, "auto"))
        cases.append((af.attention(af.rope()), d, hq, hkv, n // 4 + 3, n // 4 + 3, torch.float32, "auto"))
        for dtype in (torch.float16, torch.bfloat16):
            cases.append((af.attention(af.alibi(), af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.additive_bias(), af.rope()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.relu(), af.causal(), af.rope(theta=500000.0, scaling=af.llama3_scaling())), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.block_sparse(128), af.causal()), d, hq, hkv, n, n, dtype, "auto"))
            cases.append((af.attention(af.block_sparse(64), af.sliding_window(1000), af.alibi()), d, hq, hkv, n - 5, n, dtype, "auto"))
    for spec, d, hq, hkv, nq, nk, dtype, placement in cases:
        q = torch.randn(1, hq, nq, d, device=dev, dtype=dtype)
        k = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype)
        v = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype)
        fn = af.compile(spec, rope_placement=placement)
        data = {}
        if "additive_bias" in repr(spec):
            data["bias"] = torch.randn(1, hq, nq, nk, device=dev, dtype=torch.float32)
        sparse = next((b for b in spec.blocks if type(b).__name__ == "BlockSparse"), None)
        if sparse is not None:
            blocks = (-(-nq // sparse.block_size), -(-nk // sparse.block_size))
            data["block_layout"] = torch.rand(hq, *blocks, device=dev) < 0.4
        relu = "relu" in repr(spec)
        result = fn(q, k, v, return_lse=not relu, **data)
        out, lse = (result, None) if relu else result
        ref = af.reference_attention(spec, q, k, v, return_lse=not relu, device=dev, **data)
        ref, ref_lse = (ref, None) if relu else ref
        err = rel_err(out, ref)
        max_abs = (out.double() - ref).abs().max().item()
        lse_err = 0.0 if lse is None else (lse - ref_lse).abs().nan_to_num(0.0).max().item()
        ok = (max_abs <= 1e-4 if dtype == torch.float32 else err <= 1e-2) and torch.isfinite(out).all().item()
        failures += not ok
        print(f"{'ok ' if ok else 'FAIL'} {spec!r:70} D={d} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} {str(dtype)[6:]:9} "
              f"{placement:11} rel={err:.2e} max_abs={max_abs:.2e} lse={lse_err:.2e}", flush=True)
    print(f"{len(cases) - failures}/{len(cases)} cases ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
