"""Forward+backward time of one variant under several backward tile configurations and RoPE
placements, beside the peers (compiled flex_attention and SDPA/cuDNN, both after a compiled
pre-rotation). Used to pick `choose_tile_config`'s Hopper backward defaults.

    python bench/backward_tune.py --seq-lens 2048,4096 [--heads 32 --kv-heads 8 --head-dim 128]

Prints one line per (N, configuration): median ms of forward+backward (triton.testing.do_bench).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

import attnfuse as af
from attnfuse.runtime.config import choose_tile_config
from attnfuse.runtime.inputs import check_inputs

BACKWARD_CONFIGS = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 2)]


def time_fwd_bwd(fn, q, k, v, grad_out) -> float:
    def step():
        fn(q, k, v).backward(grad_out)

    return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    rows = []
    for n in map(int, args.seq_lens.split(",")):
        torch.manual_seed(0)
        shape_q = (args.batch, args.heads, n, args.head_dim)
        shape_k = (args.batch, args.kv_heads, n, args.head_dim)
        q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad_out = torch.randn_like(q)
        base = choose_tile_config(check_inputs(spec, q, k, v))
        for placement in ("auto", "fused"):
            for bwd in BACKWARD_CONFIGS:
                config = af.TileConfig(base.block_m, base.block_n, base.num_warps, base.num_stages, *bwd)
                fn = af.compile(spec, rope_placement=placement, config=config)
                try:
                    ms = time_fwd_bwd(fn, q, k, v, grad_out)
                except Exception as err:  # a config that does not fit (shared memory) is skipped
                    print(f"N={n} {placement} bwd={bwd}: failed ({type(err).__name__}: {str(err)[:100]})", flush=True)
                    continue
                rows.append({"n": n, "placement": placement, "bwd": bwd, "ms": ms})
                print(f"N={n} {placement:12s} bwd={bwd}: {ms:.4f} ms", flush=True)
                if placement == "fused" and len(rows) > 1 and rows[-2]["placement"] == "fused":
                    break
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
