"""Does the order in which a block-sparse forward's programs launch set its speed? A probe.

A block-major grid (batch x head on axis 0, which the GPU walks fastest; blocks on axis 1)
runs one query block of many heads at once, each program reading its own head's keys and
values; at low density a program visits few key blocks, so those reads come from HBM more
than from L2. A head-major grid (one axis, heads outermost: `tile.kernel`'s `head_major`,
which lower-to-tile sets on a listed forward) runs neighbouring blocks of a few heads at once,
which share them. This probe launches the runtime's generated kernel
(`af.compile(..., config=af.TileConfig(64, 64, 4, 2, ...))` on the portable target) on the
same tensors and block lists twice: as the runtime does, and with the other order (its tile IR
with `head_major` toggled, printed by the Triton target) over the other order's grid.

    python3 bench/block_sparse_grid_probe.py --out DIR [--densities 0.05,0.1,0.25]
    python3 bench/block_sparse_grid_probe.py --smoke    # CPU interpreter, tiny: checks the probe

Problem and layouts as `bench/block_sparse.py` (B=4, H=12, N=4096, D=64, fp16, layout blocks of
128, diagonal plus random blocks). The other order's output must equal the runtime's bit for
bit. Timing: `triton.testing.do_bench` median (L2 flushed before each call), beside the dense
call (`af.full()`, auto).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch
from xdsl.dialects.builtin import IntegerAttr, i64

import benchlib
from block_sparse import make_layout, timer


def other_grid_kernel(spec, key, interpret: bool, name: str = "attention_fwd"):
    """The kernel `name` of `spec`'s program for compile key `key` with the other grid order
    (block-major for a head-major kernel and the reverse): its tile IR with `head_major`
    toggled, printed by the Triton target and loaded as the runtime loads its kernels. Returns
    the kernel and whether that other order is head-major."""
    from attnfuse.lowering.triton import emit_module
    from attnfuse.runtime import cache as kernel_cache
    from attnfuse.runtime.compiler import lower_spec

    module = lower_spec(spec, key)
    (kernel_op,) = [op for op in module.ops if op.sym_name.data == name]
    head_major = not kernel_op.head_major
    if head_major:
        kernel_op.attributes["head_major"] = IntegerAttr(1, i64)
    else:
        kernel_op.attributes.pop("head_major")
    source = emit_module(module, interpret).source
    digest = hashlib.sha256(source.encode()).hexdigest()
    path = Path(tempfile.mkdtemp()) / "other_grid_probe.py"
    path.write_text(source)
    return getattr(kernel_cache.load_module(path, f"other_grid_{digest}", interpret, source), name), head_major


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
    from attnfuse.runtime.interpreter import interpreting

    b, h, n, d, block = (1, 2, 256, 16, 64) if args.smoke else (4, 12, 4096, 64, 128)
    dtype = torch.float32 if args.smoke else torch.float16
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))
    tiles = (64, 64, 4, 2, 64, 64, 4, 2, 64, 32, 4, 3)
    spec = af.attention(af.block_sparse(block))
    sparse = af.compile(spec, config=af.TileConfig(*tiles))
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
            kernel, other_head_major = other_grid_kernel(spec, sparse.compile_key(sparse.plan(q, k, v).problem),
                                                         interpret=args.smoke)
        bh, blocks = b * h, -(-n // launch.info.block_m)
        grid = (bh * blocks, 1) if other_head_major else (bh, blocks)
        jit_args = launch.jit_arguments(tensors)

        def transposed(jit_args=jit_args, grid=grid, launch=launch, kernel=kernel):
            # On the CPU, as the runtime runs an interpreted kernel (`interpreter.interpreting`).
            with interpreting() if args.smoke else contextlib.nullcontext():
                kernel[grid](*jit_args, *launch.scalars, num_warps=launch.info.num_warps,
                             num_stages=launch.stages[0])

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
