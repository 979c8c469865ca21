"""How many splits a decode launch should make: the split-KV kernel with its split count forced,
beside the count `kv_cache.split_plan` chooses and SDPA's flash decode, at the decode
benchmark's long caches (GPU only).

    python bench/decode_splits.py [--rows 16k,32k,8x8k] [--reps 60] [--rounds 6] [--out DIR]
    python bench/decode_splits.py --smoke      # the CPU interpreter, tiny caches: checks the plumbing

`split_plan` aims at `PROGRAMS_PER_SM` (one) program per multiprocessor; rounding the count
up alone left B=8 x 8 heads 3 splits, 192 programs on 132 SMs,
1.45 waves. Each column here forces one split count (this process replaces
`planning.split_plan`, which the plan reads when it is made; a fresh function per column);
splits are whole key blocks, so a count may launch as fewer (17 splits of a 16k cache's 256
blocks of 64 are 16 of 16 blocks): the table shows `asked->launched` there. Every output is checked against SDPA's first. Timing: each call is a
one-call CUDA graph replayed after a 256 MiB read (a clean flush: the call pays only its own
traffic), in interleaved rounds (the order rotated round by round), median µs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import benchlib

ROWS = {
    "4k": (1, 32, 8, 4096, (8, 16)),
    "16k": (1, 32, 8, 16384, (8, 16, 17, 24, 32)),
    "32k": (1, 64, 8, 32768, (16, 17, 24, 32, 33)),
    "8x8k": (8, 32, 8, 8192, (1, 2, 3, 4, 6, 8)),
}
"""Row -> (batch, query heads, key/value heads, cache length, split counts to force): the
decode benchmark's Llama-3-8B 4k, Mistral-7B 16k, Llama-3-70B 32k and B=8 x 8k caches."""


def forced_split_plan(splits: int):
    """A `split_plan` that makes `splits` splits of whole key blocks (fewer if the cache has
    fewer blocks)."""
    import triton

    def plan(problem, block_m: int, block_n: int) -> tuple[int, int]:
        key_blocks = max(1, triton.cdiv(problem.seq_k, block_n))
        split_len = triton.cdiv(key_blocks, min(splits, key_blocks)) * block_n
        return triton.cdiv(problem.seq_k, split_len) if problem.seq_k else 1, split_len
    return plan


def launched_label(asked: int, launched: int | None) -> str:
    """A forced column's label: the count asked for, and what launched where that differs."""
    return str(asked) if launched in (None, asked) else f"{asked}->{launched}"


def launched_splits(fn, q, k, v, lens) -> int | None:
    """The split count of `fn`'s plan for this cache call (None: not a split decode)."""
    from attnfuse.runtime.kv_cache import check_cache_arguments

    cache, paged_keys = check_cache_arguments(q, k, v, lens, None)
    splits = fn.plan(q, k, v, (False, False), False, cache, paged_keys).splits
    return None if splits is None else splits[0]


def smoke() -> int:
    """The forced split counts on the CPU interpreter at a tiny cache: each gives the split
    count asked for and SDPA's output."""
    import attnfuse as af
    from attnfuse.runtime import planning

    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 16)
    k, v = (torch.randn(2, 2, 256, 16) for _ in range(2))
    lens = torch.full((2,), 256, dtype=torch.int32)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    default = planning.split_plan
    for count in (1, 2, 3):
        planning.split_plan = forced_split_plan(count)
        try:
            fn = af.compile(af.attention(af.causal()))
            err = (fn(q, k, v, kv_lens=lens) - expected).abs().max().item()
            splits = launched_splits(fn, q, k, v, lens)
        finally:
            planning.split_plan = default
        print(f"forced {count}: plan {splits} splits, max err {err:.1e}")
        if splits != count or err > 1e-4:
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="16k,32k,8x8k")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke()
    if not torch.cuda.is_available():
        print("decode_splits.py: needs a CUDA device", file=sys.stderr)
        return 2
    import attnfuse as af
    from attnfuse.runtime import kv_cache, planning

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    spec = af.attention(af.causal())
    rows = []
    for name in args.rows.split(","):
        b, hq, hkv, length, counts = ROWS[name]
        torch.manual_seed(0)
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(b, hkv, length, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
        steps = {}
        row = {"row": name, "bytes": 2 * b * hkv * length * 128 * 2}
        default = kv_cache.split_plan  # planning holds its own reference: restored below
        columns = [("auto", None)] + [(f"{c} splits", c) for c in counts]
        for column, count in columns:
            planning.split_plan = default if count is None else forced_split_plan(count)
            try:
                fn = af.compile(spec)
                got = fn(q, k, v, kv_lens=lens)
                row[f"{column}_splits"] = launched_splits(fn, q, k, v, lens)
                row[f"{column}_err"] = (got.float() - expected).abs().max().item()
                steps[column] = benchlib.capture_graph(lambda fn=fn, q=q, k=k, v=v, lens=lens: fn(q, k, v, kv_lens=lens), 1)
            finally:
                planning.split_plan = default

        def sdpa(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        steps["sdpa-flash"] = benchlib.capture_graph(sdpa, 1)
        timed = benchlib.interleaved_median_ms({column: graph.replay for column, graph in steps.items()}, "cuda",
                                               3, args.reps, args.rounds, before=flush.max)
        for column, (ms, _spread) in timed.items():
            row[f"{column}_us"] = ms * 1e3
        benchlib.log(str(row))
        rows.append(row)
    meta = benchlib.metadata("cuda")
    lines = ["| row | auto (splits) | sdpa-flash | forced: splits -> µs (max err) |",
             "|---|---|---|---|"]
    for row in rows:
        forced = ", ".join(f"{launched_label(c, row.get(f'{c} splits_splits'))}: {row[f'{c} splits_us']:.2f} "
                           f"({row[f'{c} splits_err']:.0e})" for c in ROWS[row["row"]][4])
        lines.append(f"| {row['row']} | {row['auto_us']:.2f} ({row['auto_splits']}) | {row['sdpa-flash_us']:.2f} "
                     f"| {forced} |")
    print("\n".join(lines))
    markdown = ["# Decode split counts: forced against split_plan's and SDPA flash", "",
                *benchlib.metadata_lines(meta),
                "- one-call CUDA graphs, clean flush (256 MiB read) before each replay, interleaved rounds, median µs",
                "", *lines]
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-decode-splits", {"metadata": meta, "rows": rows}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
