"""Block-sparse forward time against density, AttnFuse vs flex_attention with the equivalent
BlockMask, side by side in one process (median of triton.testing.do_bench).

    python bench/block_sparse.py [--out DIR] [--densities 0.1,0.25,0.5,1.0]

Both get the same random bool layout of 128x128 blocks (shared by all heads); flex's
BlockMask is built by create_block_mask from a mask_mod reading that layout, outside the timed
region, as AttnFuse's block lists are (cached per layout).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import triton
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import attnfuse as af


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    dev, dtype, bs, n = "cuda", torch.float16, args.block, args.seq
    flex = torch.compile(flex_attention)
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device=dev, dtype=dtype) for _ in range(3))
    spec = af.attention(af.block_sparse(bs))
    fn = af.compile(spec)
    rows = []
    for density in (float(x) for x in args.densities.split(",")):
        blocks = -(-n // bs)
        layout = (torch.rand(blocks, blocks, generator=gen) < density).to(dev)
        actual = layout.float().mean().item()

        def mask_mod(b, h, q_idx, kv_idx, layout=layout):
            return layout[q_idx // bs, kv_idx // bs]

        block_mask = create_block_mask(mask_mod, None, None, n, n, device=dev, BLOCK_SIZE=bs)
        out_af = fn(q, k, v, block_layout=layout)
        out_flex = flex(q, k, v, block_mask=block_mask)
        # Rows whose layout row is empty: both give 0.
        err = ((out_af.float() - out_flex.float()).norm() / out_flex.float().norm().clamp_min(1e-6)).item()
        t_af = triton.testing.do_bench(lambda: fn(q, k, v, block_layout=layout), warmup=25, rep=100, return_mode="median")
        t_flex = triton.testing.do_bench(lambda: flex(q, k, v, block_mask=block_mask), warmup=25, rep=100, return_mode="median")
        rows.append({"density": actual, "attnfuse_ms": t_af, "flex_ms": t_flex, "speedup": t_flex / t_af, "rel_diff": err})
        print(f"density {actual:.3f}: attnfuse {t_af:.4f} ms, flex {t_flex:.4f} ms, speedup {t_flex / t_af:.2f}x, rel diff {err:.1e}", flush=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "shape": f"B={args.batch} H={args.heads} N={n} D={args.head_dim} fp16, block {bs}",
        "command": " ".join(["python", *sys.argv]),
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"{stamp}-block-sparse.json").write_text(json.dumps(meta, indent=1))
    lines = [f"# Block-sparse forward vs density ({meta['gpu']})", "", f"- {meta['shape']}",
             f"- torch {meta['torch']}, triton {meta['triton']}", f"- `{meta['command']}`", "",
             "| density | attnfuse ms | flex ms | speedup | rel diff |", "|---|---|---|---|---|"]
    lines += [f"| {r['density']:.3f} | {r['attnfuse_ms']:.4f} | {r['flex_ms']:.4f} | {r['speedup']:.2f}x | {r['rel_diff']:.1e} |" for r in rows]
    (out / f"{stamp}-block-sparse.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
