"""Sweep the split-KV decode kernel's tuning on a GPU: key block size and pipeline depth
(`config.decode_tile_config`), then how many splits a launch aims at
(`kv_cache.PROGRAMS_PER_SM`, `kv_cache.MIN_SPLIT_BLOCKS`), at the decode benchmark's
cache shapes, beside SDPA (flash). Checks every AttnFuse result against SDPA first.

    python bench/decode_tune.py [--reps 200] [--out bench/results/<stamp>-decode_tune.md]
    python bench/decode_tune.py --paged 16,64   # the same sweep over paged caches
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af
from attnfuse.runtime import api, config, kv_cache

from benchlib import log  # type: ignore[import-not-found]

ROWS = {
    "llama3-8b-4k": (1, 32, 8, 128, 4096),
    "mistral-16k": (1, 32, 8, 128, 16384),
    "llama3-70b-32k": (1, 64, 8, 128, 32768),
    "llama3-8b-b8-8k": (8, 32, 8, 128, 8192),
}


def time_us(fn, reps: int) -> float:
    """Median µs of `fn()` over CUDA-graph replays of 20 calls (no launch overhead counted
    twice: a decode step runs inside a graph in serving systems)."""
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", default=None)
    parser.add_argument("--paged", default="", help="page sizes: tune over shuffled page pools instead")
    parser.add_argument("--quick", action="store_true", help="key block and stage sweep only")
    parser.add_argument("--merge", action="store_true", help="merge-kernel stages x splits per SM only")
    args = parser.parse_args()
    page_sizes = [int(p) for p in args.paged.split(",") if p]
    torch.manual_seed(0)
    lines = [f"# decode tuning on {torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}, triton {__import__('triton').__version__}", ""]
    spec = af.attention(af.causal())
    cases = {}
    for name, (b, hq, hkv, d, length) in ROWS.items():
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hkv, length, d, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        cases[name] = (q, k, v, {"kv_lens": lens})
        for page in page_sizes:
            pool_k, pool_v, table = paginate(k, v, page)
            cases[f"{name}-p{page}"] = (q, pool_k, pool_v, {"kv_lens": lens, "block_table": table})
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            sdpa = time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.reps)
        out = af.compile(spec)(q, k, v, kv_lens=lens)
        for page in page_sizes:
            _q, pool_k, pool_v, extra = cases[f"{name}-p{page}"]
            paged = af.compile(spec)(q, pool_k, pool_v, kv_lens=lens, block_table=extra["block_table"])
            # Paged kernels step over other block sizes: equal up to the summation order.
            torch.testing.assert_close(paged, out, rtol=2e-3, atol=2e-3, msg=f"{name}: the paged cache gives another result")
        err = (out.float() - ref.float()).abs().max().item()
        gbytes = 2 * b * hkv * length * d * 2 / 1e9
        lines.append(f"- {name}: SDPA flash {sdpa:.1f} µs ({gbytes / sdpa * 1e6:.0f} GB/s); AttnFuse max err vs SDPA {err:.2e}")
        log(lines[-1])
    lines += ["", "| block_n | stages | warps | programs/SM | min split blocks | merge stages | " + " | ".join(cases) + " |",
              "|" + "---|" * (6 + len(cases))]
    original = config.decode_tile_config

    def prepared(q, k, v, extra, merge_stages):
        """A compiled variant whose plan for these tensors launches the merge kernel with
        `merge_stages` pipeline stages (a launch parameter: the source is unchanged)."""
        fn = af.compile(spec)
        layout, paged_keys = kv_cache.check_cache_arguments(q, k, v, extra.get("kv_lens"), extra.get("block_table"))
        plan = fn.plan(q, k, v, (False, False), False, layout, paged_keys)
        for launch in plan.launches:
            if launch.info.name == "attention_merge" and merge_stages is not None:
                launch.stages[0] = merge_stages
        return fn

    def sweep(block_n: int, stages: int, warps: int, per_sm: int, min_blocks: int,
              merge_stages: int | None = None, only: str | None = None) -> None:
        def tuned(problem, paged=False):
            return replace(original(problem, paged), block_n=block_n, num_stages=stages, num_warps=warps)

        api.decode_tile_config = tuned  # what compile_key calls
        kv_cache.PROGRAMS_PER_SM, kv_cache.MIN_SPLIT_BLOCKS = per_sm, min_blocks
        cells = []
        for name, (q, k, v, extra) in cases.items():
            if only is not None and (only == "paged") != ("-p" in name):
                cells.append("")
                continue
            try:
                fn = prepared(q, k, v, extra, merge_stages)
                fn(q, k, v, **extra)
                cells.append(f"{time_us(lambda: fn(q, k, v, **extra), args.reps):.1f}")
            except Exception as err:  # noqa: BLE001 - a config that does not fit is a row
                cells.append(f"fails: {type(err).__name__}")
        lines.append(f"| {block_n} | {stages} | {warps} | {per_sm} | {min_blocks} | {merge_stages or '-'} | " + " | ".join(cells) + " |")
        log(lines[-1])

    for block_n, stages, warps in itertools.product((32, 64, 128), (2, 3, 4), (4,)):
        if args.merge:
            break
        sweep(block_n, stages, warps, kv_cache.PROGRAMS_PER_SM, kv_cache.MIN_SPLIT_BLOCKS)
    if args.quick:
        return finish(lines, args.out)
    if args.merge:
        # The merge kernel's pipelining against the split count it has to walk.
        for merge_stages, per_sm in itertools.product((1, 2, 3, 4), (1, 2, 4)):
            sweep(64, 3, 4, per_sm, 4, merge_stages, only="contiguous")
            if page_sizes:
                sweep(128, 2, 4, per_sm, 4, merge_stages, only="paged")
        return finish(lines, args.out)
    for warps in (2, 8):
        sweep(64, 3, warps, 2, 4)
    for per_sm, min_blocks in itertools.product((1, 2, 4, 8), (2, 4, 8)):
        sweep(64, 3, 4, per_sm, min_blocks)
    finish(lines, args.out)


def finish(lines: list[str], out: str | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


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
    main()
