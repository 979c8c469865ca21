"""Does the order in which a block-sparse forward's programs launch set its speed? A probe.

A block-major grid (batch x head on axis 0, which the GPU walks fastest; blocks on axis 1)
runs one query block of many heads at once, each program reading its own head's keys and
values; at low density a program visits few key blocks, so those reads come from HBM more
than from L2. A head-major grid (one axis, heads outermost: `tile.kernel`'s `head_major`,
which lower-to-tile sets on a listed forward) runs neighbouring blocks of a few heads at once,
which share them. This probe launches the runtime's generated kernel
(`af.compile(..., config=af.TileConfig(64, 64, 4, 2, ...))` on the portable target) on the
same tensors and block lists twice: as the runtime does, and with the other order's prologue
(its program-id lines, nothing else) over the other order's grid.

    python3 bench/block_sparse_grid_probe.py --out DIR [--densities 0.05,0.1,0.25]
    python3 bench/block_sparse_grid_probe.py --smoke    # CPU interpreter, tiny: checks the probe

Problem and layouts as `bench/block_sparse.py` (B=4, H=12, N=4096, D=64, fp16, layout blocks of
128, diagonal plus random blocks). The other order's output must equal the runtime's bit for
bit. Timing: `triton.testing.do_bench` median (L2 flushed before each call), beside the dense
call (`af.full()`, auto).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

if "--smoke" in sys.argv:
    # The transposed module is loaded here, not by AttnFuse's cache: on the CPU it must be
    # decorated for Triton's interpreter, which `triton.jit` reads when triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"

import torch

import benchlib
from block_sparse import make_layout, timer

BLOCK_MAJOR = ("    block_id = tl.num_programs(1) - 1 - tl.program_id(1)\n"
               "    batch_head = tl.program_id(0)\n")
HEAD_MAJOR = ("    num_blocks = tl.cdiv(n_q, BLOCK_M)\n"
              "    batch_head = tl.program_id(0) // num_blocks\n"
              "    block_id = num_blocks - 1 - tl.program_id(0) % num_blocks\n")


def other_grid_kernel(source: str, name: str = "attention_fwd"):
    """The kernel `name` of a generated module's `source` with the other grid order's prologue
    (block-major for a head-major kernel and the reverse), and whether that other order is
    head-major."""
    start = source.index(f"def {name}(")
    end = source.find("\n@triton.jit", start)
    end = len(source) if end < 0 else end
    body = source[start:end]
    if body.count(HEAD_MAJOR) == 1:
        body, head_major = body.replace(HEAD_MAJOR, BLOCK_MAJOR), False
    elif body.count(BLOCK_MAJOR) == 1:
        body, head_major = body.replace(BLOCK_MAJOR, HEAD_MAJOR), True
    else:
        raise RuntimeError("the generated prologue changed: neither grid order's lines are in it")
    path = Path(tempfile.mkdtemp()) / "other_grid_probe.py"
    path.write_text(source[:start] + body + source[end:])
    spec = importlib.util.spec_from_file_location("other_grid_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name), head_major


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--densities", default="0.05,0.1,0.25")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, B=1 H=2 N=256 D=16")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("block_sparse_grid_probe.py: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import attnfuse as af
    from attnfuse.runtime import launch as launch_module

    b, h, n, d, block = (1, 2, 256, 16, 64) if args.smoke else (4, 12, 4096, 64, 128)
    dtype = torch.float32 if args.smoke else torch.float16
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))
    tiles = (64, 64, 4, 2, 64, 64, 4, 2, 64, 32, 4, 3)
    sparse = af.compile(af.attention(af.block_sparse(block)), config=af.TileConfig(*tiles))
    dense = af.compile(af.attention(af.full()))
    time_ms = timer(device, 25.0, 100.0) if not args.smoke else (lambda fn: benchlib.median_ms(fn, "cpu", 0, 1)[0])
    recorded: dict[str, dict] = {}
    original = launch_module.KernelLaunch.__call__

    def recording(self, tensors):
        recorded[self.info.name] = (self, dict(tensors))
        return original(self, tensors)

    dense_ms = time_ms(lambda: dense(q, k, v))  # auto: its plan is made before the next line
    # The block-sparse calls' plans, made from here on, take the portable target.
    os.environ["ATTNFUSE_FORWARD_TARGET"] = "triton"
    rows = []
    generator = torch.Generator().manual_seed(0)
    kernel = None
    for density in (float(x) for x in args.densities.split(",")):
        layout = make_layout(-(-n // block), density, generator).to(device)
        launch_module.KernelLaunch.__call__ = recording
        try:
            # A copy: the transposed kernel writes the runtime's own output tensor (`tensors["o"]`).
            out = sparse(q, k, v, block_layout=layout).clone()
        finally:
            launch_module.KernelLaunch.__call__ = original
        launch, tensors = recorded["attention_fwd"]
        if kernel is None:
            kernel, other_head_major = other_grid_kernel(sparse.source)
        bh, blocks = b * h, -(-n // launch.info.block_m)
        grid = (bh * blocks, 1) if other_head_major else (bh, blocks)
        jit_args = launch.jit_arguments(tensors)

        def transposed(jit_args=jit_args, grid=grid, launch=launch, kernel=kernel):
            kernel[grid](*jit_args, *launch.scalars, num_warps=launch.info.num_warps, num_stages=launch.stages[0])

        tensors["o"].zero_()
        transposed()
        got = tensors["o"].clone()
        row = {"density": layout.float().mean().item(), "bitwise_equal": bool(torch.equal(got, out)),
               "max_abs_diff": (got.float() - out.float()).abs().max().item()}
        runtime_ms = time_ms(lambda launch=launch, tensors=tensors: launch(tensors))
        other_ms = time_ms(transposed)
        row["head_major_ms"], row["block_major_ms"] = (other_ms, runtime_ms) if other_head_major else (runtime_ms, other_ms)
        row["runtime_grid"] = "block-major" if other_head_major else "head-major"
        rows.append(row)
        print(row, flush=True)
    lines = [f"dense call (`af.full()`, auto): {dense_ms:.4f} ms; tl forward 64 x 64, 4 warps, 2 stages", "",
             "| density | block-major grid ms (over dense) | head-major grid ms (over dense) | the runtime's | bitwise equal |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['density']:.3f} | {r['block_major_ms']:.4f} ({r['block_major_ms'] / dense_ms:.3f}) | "
              f"{r['head_major_ms']:.4f} ({r['head_major_ms'] / dense_ms:.3f}) | {r['runtime_grid']} | "
              f"{r['bitwise_equal']} |" for r in rows]
    print("\n".join(lines))
    meta = benchlib.metadata(device)
    markdown = ["# Block-sparse forward: the block-major grid against the head-major one", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- problem: B={b} H={h} N={n} D={d} {str(dtype).removeprefix('torch.')}, layout blocks of {block}", ""]
    markdown += lines
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-block-sparse-grid-probe",
                           {"metadata": meta, "rows": rows, "dense_ms": dense_ms}, markdown)
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
