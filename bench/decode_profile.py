"""Where a split-KV decode step's time goes on a GPU, against what a one-wave streaming read of
the same cache can do (issue 16: 80% of copy bandwidth at the long single-sequence caches).

For the decode benchmark's contiguous caches (bench/decode.py rows 1-4, fp16, one query token,
`kv_lens` filling the cache) it prints, per implementation (AttnFuse, SDPA flash):

- the kernels of one call and their device time (torch.profiler, CUPTI), and the span from the
  first kernel's start to the last one's end (the gap between AttnFuse's split and merge
  kernels counts);
- a call as a one-call CUDA graph after an L2 flush that leaves dirty lines (`zero_` of 256 MiB,
  what bench/decode.py does) and after one that leaves clean lines (a read of 256 MiB), and
  16 calls per graph with no flush (warm);

and, as the speed of light for a launch of one wave, a Triton kernel that only streams the same
K and V bytes (each of P programs reads a contiguous share and sums it), at several program
counts, block sizes and pipeline depths, timed the same three ways.

    python bench/decode_profile.py [--rows 1,2,3,4] [--reps 50] [--out DIR]
                                   [--variants kernel,kernel-stages1,last-split] [--no-stream]

`--variants` times AttnFuse's split merge in each named form: `kernel` (the default, a second
kernel), `kernel-stagesN` (its loop pipelined N deep, `config.DECODE_MERGE_STAGES`) and
`last-split` (the last split program merges, `kv_cache.DECODE_MERGE`); `kernel-longN` takes
128-key blocks from caches of N keys (`config.DECODE_LONG_CACHE`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

import benchlib  # type: ignore[import-not-found]

ROWS = {
    "1": ("Llama-3-8B B=1 L=4096", 1, 32, 8, 128, 4096),
    "2": ("Mistral-7B B=1 L=16384", 1, 32, 8, 128, 16384),
    "3": ("Llama-3-70B B=1 L=32768", 1, 64, 8, 128, 32768),
    "4": ("Llama-3-8B B=8 L=8192", 8, 32, 8, 128, 8192),
}


def decode_inputs(row: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A `ROWS` row's one-token query, its full K and V caches (fp16, seed 0) and `kv_lens`
    filling them."""
    _, b, hq, hkv, d, length = ROWS[row]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(b, hkv, length, d, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(b, hkv, length, d, device="cuda", dtype=torch.float16, generator=gen)
    return q, k, v, torch.full((b,), length, device="cuda", dtype=torch.int32)


@triton.jit
def stream_read(k_ptr, v_ptr, out_ptr, rows_per_program, D: tl.constexpr, BLOCK: tl.constexpr,
                STAGES: tl.constexpr):
    """Sums program `pid`'s contiguous share of K and V: the reads a decode must make, and
    nothing else."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * rows_per_program * D
    offsets = tl.arange(0, BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
    acc = tl.zeros([BLOCK, D], dtype=tl.float32)
    for row in tl.range(0, rows_per_program, BLOCK, num_stages=STAGES):
        k = tl.load(k_ptr + base + row * D + offsets)
        v = tl.load(v_ptr + base + row * D + offsets)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


class Flush:
    """Evicts L2 between timed calls: `dirty` zeroes 256 MiB (lines to write back), `clean`
    reads 256 MiB (lines dropped for free)."""

    def __init__(self) -> None:
        self.buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        self.buf.zero_()

    def dirty(self) -> None:
        self.buf.zero_()

    def clean(self) -> None:
        self.buf.max()


def graph_times(fn, flush: Flush, reps: int) -> dict[str, float]:
    """µs of one call as a graph after a dirty and a clean flush, and warm (16 per graph)."""
    one = benchlib.capture_graph(fn, 1)
    out = {}
    for name, before in (("dirty", flush.dirty), ("clean", flush.clean)):
        ms, _ = benchlib.median_ms(one.replay, "cuda", 5, reps, before=before)
        out[name] = ms * 1e3
    loop = benchlib.capture_graph(fn, 16)
    ms, _ = benchlib.median_ms(loop.replay, "cuda", 2, max(5, reps // 5))
    out["warm"] = ms * 1e3 / 16
    return out


def kernel_profile(fn, calls: int = 20) -> dict:
    """The kernels of one call (name, mean device µs) and the mean first-start-to-last-end span."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernels.sort(key=lambda e: e.time_range.start)
    per_call = len(kernels) // calls
    names: dict[str, list[float]] = {}
    spans = []
    for c in range(calls):
        group = kernels[c * per_call:(c + 1) * per_call]
        if not group:
            continue
        spans.append(group[-1].time_range.end - group[0].time_range.start)
        for e in group:
            names.setdefault(e.name[:70], []).append(e.time_range.end - e.time_range.start)
    return {"kernels": {n: statistics.median(t) for n, t in names.items()},
            "span": statistics.median(spans) if spans else float("nan"), "per_call": per_call}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", default=None)
    parser.add_argument("--variants", default="kernel")
    parser.add_argument("--no-stream", action="store_true", help="skip the streaming-read kernels")
    args = parser.parse_args(argv)
    import attnfuse as af
    from attnfuse.runtime import config, kv_cache

    def variant_spec(name: str):
        """A fresh compile whose plans take the merge form `name` (see --variants)."""
        merge, stages, long_cache = "kernel", config.DECODE_MERGE_STAGES, config.DECODE_LONG_CACHE
        if name == "last-split":
            merge = "last-split"
        elif name.startswith("kernel-stages"):
            stages = int(name.removeprefix("kernel-stages"))
        elif name.startswith("kernel-long"):
            long_cache = int(name.removeprefix("kernel-long"))
        elif name != "kernel":
            raise SystemExit(f"unknown variant {name!r}")
        fn = af.compile(af.attention(af.causal()))

        def call(*a, **kw):
            saved = kv_cache.DECODE_MERGE, config.DECODE_MERGE_STAGES, config.DECODE_LONG_CACHE
            kv_cache.DECODE_MERGE, config.DECODE_MERGE_STAGES, config.DECODE_LONG_CACHE = merge, stages, long_cache
            try:
                return fn(*a, **kw)
            finally:
                kv_cache.DECODE_MERGE, config.DECODE_MERGE_STAGES, config.DECODE_LONG_CACHE = saved
        return call

    lines = [f"# Decode profile ({torch.cuda.get_device_name()})", ""]
    lines += benchlib.metadata_lines(benchlib.metadata("cuda"))
    lines += ["", "```", "python3 bench/decode_profile.py " + " ".join(sys.argv[1:]), "```", ""]
    flush = Flush()
    specs = {f"attnfuse {name}": variant_spec(name) for name in args.variants.split(",")}
    for row in args.rows.split(","):
        title, b, hq, hkv, d, length = ROWS[row]
        q, k, v, lens = decode_inputs(row)
        kv_bytes = 2 * k.numel() * k.element_size()
        lines += [f"## {title} ({kv_bytes / 1e6:.1f} MB of K and V)", ""]

        def sdpa():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        impls = {name: (lambda spec=spec: spec(q, k, v, kv_lens=lens)) for name, spec in specs.items()}
        impls["sdpa-flash"] = sdpa
        ref = sdpa()
        table = []
        for name, fn in impls.items():
            err = (fn().float() - ref.float()).abs().max().item()
            prof = kernel_profile(fn)
            times = graph_times(fn, flush, args.reps)
            kern = "; ".join(f"{n} {t:.2f}" for n, t in prof["kernels"].items())
            table.append([name, f"{times['dirty']:.2f}", f"{times['clean']:.2f}", f"{times['warm']:.2f}",
                          f"{prof['span']:.2f}", f"{kv_bytes / times['clean'] / 1e3:.0f}",
                          f"{err:.1e}", kern])
        out = torch.empty(4096, device="cuda", dtype=torch.float32)
        rows_total = b * hkv * length
        for programs in () if args.no_stream else (128, 132 * 2, 132 * 4, 1056):
            programs = min(programs, rows_total // 128)
            share = rows_total // programs // 128 * 128
            for block, stages in ((64, 3), (128, 3), (64, 4), (128, 2)):
                def sol(programs=programs, share=share, block=block, stages=stages):
                    stream_read[(programs,)](k, v, out, share, D=d, BLOCK=block, STAGES=stages, num_warps=4)

                try:
                    sol()
                    times = graph_times(sol, flush, args.reps)
                    prof = kernel_profile(sol)
                    read = 2 * programs * share * d * 2
                    table.append([f"stream P={programs} {block}x{stages}", f"{times['dirty']:.2f}",
                                  f"{times['clean']:.2f}", f"{times['warm']:.2f}", f"{prof['span']:.2f}",
                                  f"{read / times['clean'] / 1e3:.0f}", "", ""])
                except Exception as exc:  # noqa: BLE001 - a configuration that does not compile
                    table.append([f"stream P={programs} {block}x{stages}", "n/a", "", "", "", "", "",
                                  benchlib.first_line(exc)])
        lines += benchlib.markdown_table(
            ["impl", "graph µs (dirty flush)", "graph µs (clean flush)", "warm µs", "kernel span µs",
             "GB/s (clean)", "max err", "kernels (µs)"], table)
        lines.append("")
        print("\n".join(lines[-len(table) - 4:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        path = Path(args.out) / f"{benchlib.stamp()}-decode_profile.md"
        path.write_text(text)
        print(f"wrote {path}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
