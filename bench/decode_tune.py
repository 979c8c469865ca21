"""Sweep the split-KV decode kernel's tuning on a GPU: key block size, pipeline depth and,
for paged caches, how far ahead a step reads its page ids (`config.decode_tile_config`,
`TileConfig.page_lookahead`), then how many splits a launch aims at
(`kv_cache.PROGRAMS_PER_SM`, `kv_cache.MIN_SPLIT_BLOCKS`) and warps, at the decode
benchmark's cache shapes, beside SDPA (flash). Every configuration's result is checked
against SDPA before it is timed (a wrong one reads `WRONG` in its cell).

    python bench/decode_tune.py [--reps 100] [--out bench/results/<stamp>-decode_tune.md]
    python bench/decode_tune.py --paged 16,64   # also over shuffled page pools: one run
    python bench/decode_tune.py --smoke         # the CPU interpreter at tiny sizes (timings mean nothing)
    python bench/decode_tune.py --paged 16 --small-steps   # hoisted page rows or not; 16- and 32-key steps

Rows stop starting after `--time-budget` seconds (default 300; the rows left are listed).

The default sweep (about 220 timed cells with `--paged 16,64`, each compiled shape once; about
4.5 minutes on the H200, most of it compiling):

1. block_n 64/128 x 2-4 stages, page ids a step ahead (the default); the same as the
   contiguous cache's (both are timed in each row);
2. paged only, page ids read in their own step (`page lookahead` 0, the code before the
   lookahead), at 128/2 (its best before), 64/3 and 128/3: the lookahead's effect;
3. one sequence's streaming (the long caches): the split merge's loop unpipelined (the code
   before) and 4 deep against the default 3, 8 warps, 5 stages, two programs per SM, longer
   splits.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af
from attnfuse.runtime import config, kv_cache, planning

from benchlib import log  # type: ignore[import-not-found]

ROWS = {
    "llama3-8b-4k": (1, 32, 8, 128, 4096),
    "mistral-16k": (1, 32, 8, 128, 16384),
    "llama3-70b-32k": (1, 64, 8, 128, 32768),
    "llama3-8b-b8-8k": (8, 32, 8, 128, 8192),
}
"""(B, Hq, Hkv, D, L): the decode benchmark's caches (bench/decode.py rows 1-4)."""

SMOKE_ROWS = {"tiny-b2": (2, 4, 1, 32, 192)}
"""`--smoke`: caches the CPU interpreter runs in seconds (L a multiple of 64-row pages)."""


def time_us(fn, reps: int) -> float:
    """Median µs of `fn()` over CUDA-graph replays of 20 calls (no launch overhead counted
    twice: a decode step runs inside a graph in serving systems); on the CPU (`--smoke`), the
    wall clock of single calls."""
    if not torch.cuda.is_available():
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return sorted(times)[len(times) // 2]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(20):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 20)
    times.sort()
    return times[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", default=None)
    parser.add_argument("--paged", default="", help="page sizes: also tune over shuffled page pools")
    parser.add_argument("--quick", action="store_true", help="key block x stages x page lookahead only")
    parser.add_argument("--merge", action="store_true", help="merge-kernel stages x splits per SM only")
    parser.add_argument("--small-steps", action="store_true",
                        help="paged only: key steps of 16 / 32 keys (one or two 16-key pages a step, "
                             "their ids per step) x 3-8 stages, against the default")
    parser.add_argument("--smoke", action="store_true", help="tiny caches on the CPU interpreter (timings mean nothing)")
    parser.add_argument("--time-budget", type=float, default=300.0,
                        help="seconds from the start after which no further row starts (the table says which were left)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    page_sizes = [int(p) for p in args.paged.split(",") if p]
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    dtype = torch.float16 if device == "cuda" else torch.float32
    rows = SMOKE_ROWS if args.smoke else ROWS
    torch.manual_seed(0)
    where = torch.cuda.get_device_name() if device == "cuda" else "the CPU (Triton interpreter)"
    lines = [f"# decode tuning on {where}", "",
             f"torch {torch.__version__}, triton {__import__('triton').__version__}", ""]
    spec = af.attention(af.causal())
    cases = {}
    refs = {}
    for name, (b, hq, hkv, d, length) in rows.items():
        q = torch.randn(b, hq, 1, d, device=device, dtype=dtype)
        k = torch.randn(b, hkv, length, d, device=device, dtype=dtype)
        v = torch.randn_like(k)
        lens = torch.full((b,), length, dtype=torch.int32, device=device)
        cases[name] = (q, k, v, {"kv_lens": lens})
        for page in page_sizes:
            pool_k, pool_v, table = paginate(k, v, page)
            cases[f"{name}-p{page}"] = (q, pool_k, pool_v, {"kv_lens": lens, "block_table": table})
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            sdpa = time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.reps)
        refs[name] = ref
        for page in page_sizes:
            refs[f"{name}-p{page}"] = ref
        out = af.compile(spec)(q, k, v, kv_lens=lens)
        err = (out.float() - ref.float()).abs().max().item()
        gbytes = 2 * b * hkv * length * d * k.element_size() / 1e9
        lines.append(f"- {name}: SDPA {'flash ' if device == 'cuda' else ''}{sdpa:.1f} µs ({gbytes / sdpa * 1e6:.0f} GB/s); "
                     f"AttnFuse max err vs SDPA {err:.2e}")
        log(lines[-1])
    lines += ["", "Cells: µs per call (on a GPU: CUDA-graph replays of 20 calls, warm L2); `WRONG`: the result is not SDPA's. "
              f"Merge stages `default`: the decode configuration's ({config.DECODE_MERGE_STAGES} on a GPU).", "",
              "| block_n | stages | warps | page lookahead | programs/SM | min split blocks | merge stages | "
              + " | ".join(cases) + " |",
              "|" + "---|" * (7 + len(cases))]
    original = config.decode_tile_config

    def sweep(block_n: int, stages: int, warps: int = 4, per_sm: int = 1, min_blocks: int = 4,
              merge_stages: int | None = None, only: str | None = None, lookahead: int = 1,
              hoist: int = 1) -> None:
        """One row: every case (or only the "paged" / "contiguous" ones) under this
        configuration, checked against SDPA, then timed."""
        ahead = f"{lookahead}{'' if hoist else ' (rows per step)'}" if page_sizes else "-"
        if time.monotonic() - started > args.time_budget:
            lines.append(f"| {block_n} | {stages} | {warps} | {ahead} | {per_sm} | {min_blocks} | "
                         f"{merge_stages or 'default'} | " + " | ".join("not run (time budget)" for _ in cases) + " |")
            log(lines[-1])
            return
        def tuned(problem, paged=False):
            base = original(problem, paged)
            return replace(base, block_n=block_n, num_stages=stages, num_warps=warps, page_lookahead=lookahead,
                           hoist_page_rows=hoist, merge_stages=base.merge_stages if merge_stages is None else merge_stages)

        planning.decode_tile_config = tuned  # what compile_key calls
        kv_cache.PROGRAMS_PER_SM, kv_cache.MIN_SPLIT_BLOCKS = per_sm, min_blocks
        cells = []
        for name, (q, k, v, extra) in cases.items():
            if only is not None and (only == "paged") != ("-p" in name):
                cells.append("")
                continue
            try:
                fn = af.compile(spec)
                out = fn(q, k, v, **extra)
                if not torch.allclose(out.float(), refs[name].float(), rtol=2e-3, atol=2e-3):
                    cells.append("WRONG")
                    continue
                cells.append(f"{time_us(lambda: fn(q, k, v, **extra), args.reps):.1f}")
            except Exception as err:  # noqa: BLE001 - a config that does not fit is a row
                cells.append(f"fails: {type(err).__name__}")
        lines.append(f"| {block_n} | {stages} | {warps} | {ahead} | {per_sm} | {min_blocks} | "
                     f"{merge_stages or 'default'} | " + " | ".join(cells) + " |")
        log(lines[-1])

    saved = kv_cache.PROGRAMS_PER_SM, kv_cache.MIN_SPLIT_BLOCKS
    try:
        if args.smoke:
            # Both table paths (a table entry per key for 16-row pages, per step for 64-row
            # ones at 32/64-key blocks), both lookaheads, the long-cache axes: code paths only.
            for block_n in (32, 64):
                sweep(block_n, 1)
            sweep(32, 1, only="paged" if page_sizes else None, lookahead=0, merge_stages=1)
            sweep(32, 1, warps=8, per_sm=2, min_blocks=1)
            sweep(32, 1, only="paged" if page_sizes else None, hoist=0)
            return finish(lines, args.out)
        if args.small_steps:
            # The page rows hoisted (the default) or derived per step, at the decode
            # configurations; then steps no longer than a small page, which read one table
            # entry per step, not per key.
            for block_n in (64, 128):
                sweep(block_n, 3, only="paged")
                sweep(block_n, 3, only="paged", hoist=0)
            for block_n, stages in itertools.product((16, 32), (3, 4, 6, 8)):
                sweep(block_n, stages, only="paged")
            return finish(lines, args.out)
        if args.merge:
            # The merge kernel's pipelining against the split count it has to walk.
            for merge_stages, per_sm in itertools.product((1, 2, 3, 4), (1, 2)):
                sweep(64, 3, per_sm=per_sm, merge_stages=merge_stages, only="contiguous")
                if page_sizes:
                    sweep(64, 3, per_sm=per_sm, merge_stages=merge_stages, only="paged")
            return finish(lines, args.out)
        # 1. Block and depth, page ids a step ahead: paged against contiguous in each row.
        for block_n, stages in itertools.product((64, 128), (2, 3, 4)):
            sweep(block_n, stages)
        # 2. Page ids read in their own step (the code before the lookahead): its effect.
        if page_sizes:
            for block_n, stages in ((128, 2), (64, 3), (128, 3)):
                sweep(block_n, stages, only="paged", lookahead=0)
        if args.quick:
            return finish(lines, args.out)
        # 3. One sequence's streaming (B=1 long caches): the merge's loop over the splits
        # unpipelined (the code before) and deeper, more warps, a deeper pipeline, two
        # programs per SM (smaller blocks fit two per SM's shared memory), longer splits.
        for block_n, stages in ((64, 3), (128, 3)):
            for merge_stages in (1, 4):
                sweep(block_n, stages, merge_stages=merge_stages)
        for block_n, stages in ((64, 3), (128, 3)):
            sweep(block_n, stages, warps=8)
        sweep(64, 5)
        for block_n, stages in ((64, 2), (64, 3)):
            sweep(block_n, stages, per_sm=2)
        sweep(128, 3, min_blocks=8)
        return finish(lines, args.out)
    finally:
        planning.decode_tile_config = original
        kv_cache.PROGRAMS_PER_SM, kv_cache.MIN_SPLIT_BLOCKS = saved


def finish(lines: list[str], out: str | None) -> int:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0


def paginate(k: torch.Tensor, v: torch.Tensor, page: int):
    """Page pools of k and v `[B * pages, Hkv, page, D]` in shuffled page order, with the
    block table `[B, pages]` that lists each sequence's pages in order."""
    b, hkv, length, d = k.shape
    pages = length // page
    order = torch.randperm(b * pages, device=k.device)
    pool_k = torch.empty(b * pages, hkv, page, d, dtype=k.dtype, device=k.device)
    pool_v = torch.empty(b * pages, hkv, page, v.shape[-1], dtype=v.dtype, device=v.device)
    table = order.reshape(b, pages).to(torch.int32)
    pool_k[order] = k.reshape(b, hkv, pages, page, d).transpose(1, 2).reshape(b * pages, hkv, page, d)
    pool_v[order] = v.reshape(b, hkv, pages, page, -1).transpose(1, 2).reshape(b * pages, hkv, page, v.shape[-1])
    return pool_k, pool_v, table


if __name__ == "__main__":
    raise SystemExit(main())
