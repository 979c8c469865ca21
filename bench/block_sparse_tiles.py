"""Block-sparse forward time under a sweep of the portable (tl) kernel's tile configurations,
beside the default call (`auto`: the Gluon kernel on Hopper) and compiled flex_attention: which
tiles suit a listed kernel at low density, where per-program costs weigh most.

    python bench/block_sparse_tiles.py --out DIR [--densities 0.05,0.1,0.25] [--head-dim 64]
        [--configs 64,64,4,3;128,64,8,3] [--gluon-tiles 64,128;128,128;128,64] [--row-orders drawn,heavy,light]

Problem, layouts and checks as `bench/block_sparse.py` (B=4, H=12, N=4096, fp16, layout blocks
of 128, the diagonal plus random blocks, every output checked against a float32 reference
first). A configuration is block_m,block_n,num_warps,num_stages of the forward; each tl column
is `af.compile(spec, config=af.TileConfig(...))` under `ATTNFUSE_FORWARD_TARGET=triton`, so the
block lists are built for its tiles. A `--gluon-tiles` entry is block_m,block_n of the Gluon
forward's listed kernel (a consumer warpgroup per 64 rows): for its column this process sets
`config.LISTED_GLUON_FORWARD` to those tiles (`planning` and `gluon_forward` read it at import,
so both their copies are replaced while the column compiles and runs), a measurement knob the
package does not offer, since block lists are built before the kernel is lowered. Timing: `triton.testing.do_bench` median, L2 flushed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import contextlib

import torch

import benchlib
from block_sparse import flex_block_mask, make_layout, reference, relative_error, timer

CONFIGS = "64,64,4,3;64,64,4,2;128,64,4,3;128,64,8,3;128,64,8,2;64,128,4,3;128,128,8,3;128,128,8,2"
BACKWARD = (64, 64, 4, 2, 64, 32, 4, 3)
"""Backward tiles of the forced configurations (never run here: an inference sweep)."""


ROW_ORDERS = ("drawn", "heavy", "light")


def reorder_rows(layout: torch.Tensor, order: str) -> torch.Tensor:
    """`layout` as drawn, or with its rows sorted by kept blocks (`heavy`: most first; `light`:
    fewest first). Each row keeps what it kept, so the work is the same; only which programs
    of the grid (launched in query-block order) carry it moves."""
    if order == "drawn":
        return layout
    counts = layout.sum(-1)
    rows = torch.argsort(counts, descending=order == "heavy", stable=True)
    return layout[rows].contiguous()


@contextlib.contextmanager
def listed_gluon_tiles(tiles: tuple[int, int]):
    """`config.LISTED_GLUON_FORWARD` set to `tiles` (block_m, block_n; two stages, 4 warps per
    64 rows as the default's 8 for 128) in the modules that copied it at import, restored
    after."""
    from attnfuse.runtime import gluon_forward, planning
    bm, bn = tiles
    saved = planning.LISTED_GLUON_FORWARD, gluon_forward.LISTED_GLUON_TILES
    planning.LISTED_GLUON_FORWARD, gluon_forward.LISTED_GLUON_TILES = (bm, bn, 4 * max(bm // 64, 1), 2), (bm, bn)
    try:
        yield
    finally:
        planning.LISTED_GLUON_FORWARD, gluon_forward.LISTED_GLUON_TILES = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--densities", default="0.05,0.1,0.25")
    parser.add_argument("--configs", default=CONFIGS)
    parser.add_argument("--row-orders", default="drawn",
                        help="layouts per density, ','-separated: drawn (as make_layout draws it), heavy "
                             "(its rows sorted by kept blocks, most first), light (fewest first): the same "
                             "work in another program order, to see what the scheduling tail costs")
    parser.add_argument("--gluon-tiles", default="",
                        help="block_m,block_n of the Gluon listed forward, ';'-separated (Hopper only)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--tol", type=float, default=2e-2)
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("block_sparse_tiles.py: needs a CUDA device", file=sys.stderr)
        return 2
    import attnfuse as af
    from torch.nn.attention.flex_attention import flex_attention

    benchlib.bench_tool.configure_dynamo()
    flex = torch.compile(flex_attention, dynamic=False)
    n, block, blocks = args.seq, args.block, -(-args.seq // args.block)
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device="cuda", dtype=torch.float16)
               for _ in range(3))
    spec = af.attention(af.block_sparse(block))
    time_ms = timer("cuda", 25.0, 100.0)
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
    gluon_tiles = [tuple(int(x) for x in c.split(",")) for c in args.gluon_tiles.split(";") if c]
    orders = args.row_orders.split(",")
    unknown = set(orders) - set(ROW_ORDERS)
    if unknown:
        parser.error(f"--row-orders: unknown {', '.join(sorted(unknown))}; known: {', '.join(ROW_ORDERS)}")
    names = ["auto", "flex"] + [f"gluon {t}" for t in gluon_tiles] + [f"tl {c}" for c in configs]
    columns = [name if order == "drawn" else f"{name} @{order}" for order in orders for name in names]
    generator = torch.Generator().manual_seed(0)
    rows = []
    dense = af.compile(af.attention(af.full()))
    dense_ms = time_ms(lambda: dense(q, k, v))

    def time_layout(layout: torch.Tensor, suffix: str, row: dict) -> None:
        """Times every column on `layout`, storing its cells under the column's name + `suffix`."""
        ref = reference(q, k, v, layout, block)
        calls = {"auto": (af.compile(spec), {}, None),
                 **{f"gluon {t}": (af.compile(spec), {"ATTNFUSE_FORWARD_TARGET": "gluon"}, t) for t in gluon_tiles},
                 **{f"tl {c}": (af.compile(spec, config=af.TileConfig(*c, *BACKWARD)), {"ATTNFUSE_FORWARD_TARGET": "triton"},
                                None) for c in configs}}
        for name, (fn, env, tiles) in calls.items():
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            try:
                with listed_gluon_tiles(tiles) if tiles else contextlib.nullcontext():
                    call = lambda fn=fn: fn(q, k, v, block_layout=layout)  # noqa: E731
                    benchlib.record_checked(row, name + suffix, relative_error(call(), ref), args.tol, lambda: time_ms(call))
            except Exception as err:  # noqa: BLE001 - a configuration that does not fit is a cell
                row[f"{name}{suffix}_error"] = benchlib.first_line(err)
            finally:
                for key, value in saved.items():
                    os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        bm = flex_block_mask(layout, n, block)
        call = lambda: flex(q, k, v, block_mask=bm)  # noqa: E731
        benchlib.record_checked(row, "flex" + suffix, relative_error(call(), ref), args.tol, lambda: time_ms(call))

    for density in (float(d) for d in args.densities.split(",")):
        drawn = make_layout(blocks, density, generator).cuda()
        row = {"density": drawn.float().mean().item()}
        for order in orders:
            layout = reorder_rows(drawn, order)
            suffix = "" if order == "drawn" else f" @{order}"
            time_layout(layout, suffix, row)
        rows.append(row)
        print(row, flush=True)

    def cell(row, name):
        ms = row.get(f"{name}_ms")
        return f"{ms:.4f} ({ms / dense_ms:.3f})" if ms else row.get(f"{name}_error", "-")

    lines = [f"dense call (`af.full()`, auto): {dense_ms:.4f} ms; cells: ms (over the dense call)", "",
             "| density | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {r['density']:.3f} | " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
    print("\n".join(lines))
    meta = benchlib.metadata("cuda")
    markdown = ["# Block-sparse forward: tl tile configurations beside auto and flex", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- problem: B={args.batch} H={args.heads} N={n} D={args.head_dim} fp16, layout blocks of {block}", ""]
    markdown += lines
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-block-sparse-tiles", {"metadata": meta, "rows": rows,
                                                                                "dense_ms": dense_ms}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
