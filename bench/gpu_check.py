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
    for spec, d, hq, hkv, nq, nk, dtype, placement in cases:
        q = torch.randn(1, hq, nq, d, device=dev, dtype=dtype)
        k = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype)
        v = torch.randn(1, hkv, nk, d, device=dev, dtype=dtype)
        fn = af.compile(spec, rope_placement=placement)
        out, lse = fn(q, k, v, return_lse=True)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, device=dev)
        err = rel_err(out, ref)
        max_abs = (out.double() - ref).abs().max().item()
        lse_err = (lse - ref_lse).abs().nan_to_num(0.0).max().item()
        ok = (max_abs <= 1e-4 if dtype == torch.float32 else err <= 1e-2) and torch.isfinite(out).all().item()
        failures += not ok
        print(f"{'ok ' if ok else 'FAIL'} {spec!r:70} D={d} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} {str(dtype)[6:]:9} "
              f"{placement:11} rel={err:.2e} max_abs={max_abs:.2e} lse={lse_err:.2e}", flush=True)
    print(f"{len(cases) - failures}/{len(cases)} cases ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
