"""Block-sparse forward time against layout density: AttnFuse's `block_sparse` beside compiled
flex_attention with the same layout as a BlockMask, and each beside its own dense call.

    python bench/block_sparse.py --out DIR [--densities 0.05,0.086,0.1,0.25,0.5,1.0]
    python bench/block_sparse.py --quick --out DIR      # CPU, tiny sizes: checks the script

Default problem: B=4, H=12, N=4096, D=64, fp16, no causal mask, layout blocks of 128 (a
32 x 32 layout shared by every head). A layout of density d keeps round(d * blocks) blocks:
the diagonal (so no query row is empty, as in every model that uses such layouts) plus blocks
drawn at random off it; the density reported is the layout's own.

- `attnfuse`: `af.compile(af.attention(af.block_sparse(128)))` called with `block_layout=` the
  same bool tensor every call, as a model passes its layout (the runtime caches the block lists
  it derives from it).
- `attnfuse dense`: `af.compile(af.attention(af.full()))`, the same inputs.
- `flex`: `torch.compile(flex_attention)` with a BlockMask built once per layout by
  `BlockMask.from_kv_blocks`, every kept block marked full (no mask_mod evaluated inside it),
  reused across calls; `flex dense` is the same compiled function without a mask.

Every output is first checked against a float32 reference (SDPA on upcast inputs with the
layout expanded to a dense bool `attn_mask`); a wrong output is reported and not timed.
Timing: `triton.testing.do_bench` median (L2 flushed before each run) on the GPU. The ratio
`sparse / dense` is each implementation's sparse time over its own dense time; the issue's
target is AttnFuse's ratio <= 0.2 at densities <= 10%. Writes a `.json`, a `.md` and (with
matplotlib) a `.png` to `--out`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import benchlib

TARGET_RATIO, TARGET_DENSITY = 0.2, 0.10


def make_layout(blocks: int, density: float, generator: torch.Generator) -> torch.Tensor:
    """A [blocks, blocks] bool layout with round(density * blocks^2) kept blocks: the diagonal,
    then off-diagonal blocks at random."""
    keep = max(blocks, round(density * blocks * blocks))
    layout = torch.eye(blocks, dtype=torch.bool)
    off = (~layout).flatten().nonzero().flatten()
    chosen = off[torch.randperm(off.numel(), generator=generator)[: keep - blocks]]
    layout.view(-1)[chosen] = True
    return layout


def flex_block_mask(layout: torch.Tensor, n: int, block: int):
    """A BlockMask with exactly the layout's blocks, all full, for every batch and head."""
    from torch.nn.attention.flex_attention import BlockMask

    rows = layout.shape[0]
    counts = layout.sum(-1, dtype=torch.int32)
    # Kept columns first, in ascending order; the tail past each row's count is never read.
    order = torch.argsort((~layout).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    empty_counts = torch.zeros(1, 1, rows, dtype=torch.int32, device=layout.device)
    empty_indices = torch.zeros(1, 1, rows, rows, dtype=torch.int32, device=layout.device)
    return BlockMask.from_kv_blocks(empty_counts, empty_indices, counts[None, None], order[None, None],
                                    BLOCK_SIZE=block, seq_lengths=(n, n))


def reference(q, k, v, layout: torch.Tensor, block: int) -> torch.Tensor:
    """float32 attention with the layout expanded to a dense [N, N] mask."""
    n = q.shape[-2]
    mask = layout.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :n]
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def timer(device: str, warmup_ms: float, rep_ms: float):
    """ms per call: do_bench's median on the GPU, the wall-clock median on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return lambda fn: benchlib.median_ms(fn, "cpu", warmup=1, reps=3)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--densities", help="comma-separated layout densities (default "
                        "0.05,0.086,0.1,0.25,0.5,1.0; with --quick 0.5,1.0)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench repetition time, ms")
    parser.add_argument("--tol", type=float, default=2e-2, help="relative error allowed against the reference")
    parser.add_argument("--sparse-target", choices=("gluon", "triton"),
                        help="ATTNFUSE_FORWARD_TARGET for the block-sparse calls only (the dense call stays auto)")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--quick", action="store_true",
                        help="CPU, B=1 H=2 N=128 D=16 fp32, blocks of 32: checks the script, times nothing useful")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    dtype = torch.float16
    if args.quick:
        args.batch, args.heads, args.seq, args.head_dim, args.block = 1, 2, 128, 16, 32
        args.densities = args.densities or "0.5,1.0"
        args.warmup = args.rep = 1.0
        dtype = torch.float32
    elif device == "cpu":
        print("block_sparse.py: no CUDA device; pass --quick to check the script on the CPU", file=sys.stderr)
        return 2
    import attnfuse as af
    from torch.nn.attention.flex_attention import flex_attention

    benchlib.bench_tool.configure_dynamo()
    flex = torch.compile(flex_attention, dynamic=False)
    n, block = args.seq, args.block
    blocks = -(-n // block)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device=device, dtype=dtype)
               for _ in range(3))
    sparse = af.compile(af.attention(af.block_sparse(block)))
    dense = af.compile(af.attention(af.full()))
    time_ms = timer(device, args.warmup, args.rep)
    densities = [float(x) for x in (args.densities or "0.05,0.086,0.1,0.25,0.5,1.0").split(",")]
    ok = True

    def checked(name: str, fn, ref: torch.Tensor, row: dict) -> None:
        """Check `fn` against `ref`, then time it (ms stored under `name`)."""
        nonlocal ok
        try:
            if not benchlib.record_checked(row, name, relative_error(fn(), ref), args.tol, lambda: time_ms(fn)):
                ok = False
        except Exception as err:  # noqa: BLE001 - one implementation failing is a cell
            row[f"{name}_error"] = benchlib.first_line(err)

    dense_row: dict = {}
    all_blocks = torch.ones(blocks, blocks, dtype=torch.bool, device=device)
    with benchlib.CaseProgress(2 + 2 * len(densities)) as progress:
        ref = reference(q, k, v, all_blocks, block)
        progress.step("dense attnfuse")
        checked("attnfuse", lambda: dense(q, k, v), ref, dense_row)
        progress.step("dense flex")
        checked("flex", lambda: flex(q, k, v), ref, dense_row)
        if args.sparse_target:
            # Read when a call's plan is made: the dense call's was made above, under auto.
            os.environ["ATTNFUSE_FORWARD_TARGET"] = args.sparse_target
        rows = []
        for density in densities:
            layout = make_layout(blocks, density, generator).to(device)
            block_mask = flex_block_mask(layout, n, block)
            row = {"density_asked": density, "density": layout.float().mean().item(),
                   "kept_blocks": int(layout.sum()), "blocks": blocks * blocks}
            ref = reference(q, k, v, layout, block)
            progress.step(f"density {row['density']:.3f} attnfuse")
            checked("attnfuse", lambda layout=layout: sparse(q, k, v, block_layout=layout), ref, row)
            progress.step(f"density {row['density']:.3f} flex")
            checked("flex", lambda bm=block_mask: flex(q, k, v, block_mask=bm), ref, row)
            for name in ("attnfuse", "flex"):
                mine, base = row.get(f"{name}_ms"), dense_row.get(f"{name}_ms")
                row[f"{name}_ratio"] = mine / base if mine and base else None
            if row.get("attnfuse_ms") and row.get("flex_ms"):
                row["flex_over_attnfuse"] = row["flex_ms"] / row["attnfuse_ms"]
            if row["density"] <= TARGET_DENSITY + 1e-9 and row["attnfuse_ratio"] is not None:
                row["meets_target"] = row["attnfuse_ratio"] <= TARGET_RATIO
            rows.append(row)
            del ref

    meta = benchlib.metadata(device)
    shape = (f"B={args.batch} H={args.heads} N={n} D={args.head_dim} {str(dtype).removeprefix('torch.')}, "
             f"no causal mask, layout blocks of {block} ({blocks}x{blocks}, shared by the heads)")
    lines = table(rows, dense_row)
    print("\n".join(lines))
    markdown = [f"# Block-sparse forward against density ({meta['gpu'] or 'CPU'})", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- problem: {shape}",
                 "- timing: " + ("triton do_bench median, L2 flushed" if device == "cuda" else "CPU wall clock (smoke test)"),
                 f"- target: AttnFuse sparse / dense <= {TARGET_RATIO} at density <= {TARGET_DENSITY:.0%}", ""]
    markdown += lines
    document = {"metadata": meta, "config": {**vars(args), "out": str(args.out), "shape": shape},
                "dense": dense_row, "rows": rows}
    stem = f"{benchlib.stamp()}-block-sparse"
    json_path, _ = benchlib.write_outputs(args.out, stem, document, markdown)
    plot(document, json_path.with_suffix(".png"))
    return 0 if ok else 1


def table(rows: list[dict], dense_row: dict) -> list[str]:
    header = ["density", "kept blocks", "attnfuse ms", "attnfuse sparse/dense", "flex ms",
              "flex sparse/dense", "flex / attnfuse", "target"]

    def ms(row: dict, name: str) -> str:
        return row.get(f"{name}_error") or benchlib.fmt(row.get(f"{name}_ms"), ".4f")

    cells = [["dense", "all", ms(dense_row, "attnfuse"), "1", ms(dense_row, "flex"), "1",
              benchlib.fmt((dense_row.get("flex_ms") or 0) / dense_row["attnfuse_ms"]
                           if dense_row.get("attnfuse_ms") and dense_row.get("flex_ms") else None, ".2f", "x"), ""]]
    for row in rows:
        met = row.get("meets_target")
        target = "" if met is None else ("meets" if met else "misses") + f" <= {TARGET_RATIO}"
        cells.append([f"{row['density']:.3f}", f"{row['kept_blocks']}/{row['blocks']}", ms(row, "attnfuse"),
                      benchlib.fmt(row.get("attnfuse_ratio"), ".3f"), ms(row, "flex"),
                      benchlib.fmt(row.get("flex_ratio"), ".3f"),
                      benchlib.fmt(row.get("flex_over_attnfuse"), ".2f", "x"), target])
    return benchlib.markdown_table(header, cells)


def plot(document: dict, path: Path) -> None:
    """Time against density, and sparse/dense against density, per implementation."""
    rows = document["rows"]
    times = {name: {r["density"]: r[f"{name}_ms"] for r in rows if r.get(f"{name}_ms")} for name in ("attnfuse", "flex")}
    ratios = {name: {r["density"]: r[f"{name}_ratio"] for r in rows if r.get(f"{name}_ratio")}
              for name in ("attnfuse", "flex")}
    ratios["ideal (= density)"] = {r["density"]: r["density"] for r in rows}
    panels = [{"series": times, "xlabel": "layout density (fraction of blocks kept)", "ylabel": "time per call (ms)",
               "xscale": "linear", "yscale": "log"},
              {"series": ratios, "xlabel": "layout density (fraction of blocks kept)",
               "ylabel": "sparse time / own dense time", "xscale": "linear", "yscale": "linear",
               "hline": (TARGET_RATIO, f"target {TARGET_RATIO} (density <= {TARGET_DENSITY:.0%})")}]
    title = f"block-sparse forward: {document['config']['shape']} on {document['metadata']['gpu'] or 'CPU'}"
    written = benchlib.plot_panels(path, title, panels)
    if written:
        print(f"wrote {written}")


if __name__ == "__main__":
    sys.exit(main())
