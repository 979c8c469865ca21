"""Does the order in which a block-sparse forward's programs launch set its speed? A probe.

The portable forward's grid puts batch x head on axis 0, which the GPU walks fastest, so the
programs running at once are one query block of many heads, each reading its own head's keys
and values. At low density a program visits few key blocks, and the keys and values it reads
may come from HBM more often than from L2. This probe launches the same generated kernel
(`af.compile(..., config=af.TileConfig(64, 64, 4, 2, ...))` on the portable target) twice on
the same tensors and block lists: as the runtime does, and with its grid transposed (query
blocks on axis 0, so the programs running at once are many query blocks of few heads, which
share their keys and values in L2). The transposed kernel is the generated source with its
two program-id reads swapped, nothing else.

    python3 bench/block_sparse_grid_probe.py --out DIR [--densities 0.05,0.1,0.25]
    python3 bench/block_sparse_grid_probe.py --smoke    # CPU interpreter, tiny: checks the probe

Problem and layouts as `bench/block_sparse.py` (B=4, H=12, N=4096, D=64, fp16, layout blocks of
128, diagonal plus random blocks). Each transposed output must equal the runtime's bit for bit.
Timing: `triton.testing.do_bench` median (L2 flushed before each call), beside the dense call.
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

BLOCK_ROW = "    block_id = tl.num_programs(1) - 1 - tl.program_id(1)\n"
HEAD_ROW = "    batch_head = tl.program_id(0)\n"


def transposed_kernel(source: str, name: str = "attention_fwd"):
    """The kernel `name` of a generated module's `source`, reading its query block from grid
    axis 0 and its batch x head from axis 1 (launched over the transposed grid)."""
    start = source.index(f"def {name}(")
    end = source.find("\n@triton.jit", start)
    end = len(source) if end < 0 else end
    body = source[start:end]
    if body.count(BLOCK_ROW) != 1 or body.count(HEAD_ROW) != 1:
        raise RuntimeError("the generated prologue changed: this probe's two lines are not in it")
    body = body.replace(BLOCK_ROW, "    block_id = tl.num_programs(0) - 1 - tl.program_id(0)\n")
    body = body.replace(HEAD_ROW, "    batch_head = tl.program_id(1)\n")
    patched = source[:start] + body + source[end:]
    path = Path(tempfile.mkdtemp()) / "transposed_grid_probe.py"
    path.write_text(patched)
    spec = importlib.util.spec_from_file_location("transposed_grid_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)


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
    os.environ["ATTNFUSE_FORWARD_TARGET"] = "triton"
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

    dense_ms = time_ms(lambda: dense(q, k, v))
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
            kernel = transposed_kernel(sparse.source)
        grid = (launch.grid[1], launch.grid[0])
        jit_args = launch.jit_arguments(tensors)

        def transposed(jit_args=jit_args, grid=grid, launch=launch, kernel=kernel):
            kernel[grid](*jit_args, *launch.scalars, num_warps=launch.info.num_warps, num_stages=launch.stages[0])

        tensors["o"].zero_()
        transposed()
        got = tensors["o"].clone()
        row = {"density": layout.float().mean().item(), "bitwise_equal": bool(torch.equal(got, out)),
               "max_abs_diff": (got.float() - out.float()).abs().max().item()}
        row["runtime_ms"] = time_ms(lambda launch=launch, tensors=tensors: launch(tensors))
        row["transposed_ms"] = time_ms(transposed)
        rows.append(row)
        print(row, flush=True)
    lines = [f"dense call (`af.full()`, auto): {dense_ms:.4f} ms; tl forward 64 x 64, 4 warps, 2 stages", "",
             "| density | runtime grid ms (over dense) | transposed grid ms (over dense) | bitwise equal |",
             "|---|---|---|---|"]
    lines += [f"| {r['density']:.3f} | {r['runtime_ms']:.4f} ({r['runtime_ms'] / dense_ms:.3f}) | "
              f"{r['transposed_ms']:.4f} ({r['transposed_ms'] / dense_ms:.3f}) | {r['bitwise_equal']} |" for r in rows]
    print("\n".join(lines))
    meta = benchlib.metadata(device)
    markdown = ["# Block-sparse forward: the runtime's grid against the transposed one", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- problem: B={b} H={h} N={n} D={d} {str(dtype).removeprefix('torch.')}, layout blocks of {block}", ""]
    markdown += lines
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-block-sparse-grid-probe",
                           {"metadata": meta, "rows": rows, "dense_ms": dense_ms}, markdown)
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
