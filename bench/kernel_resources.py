"""Registers, spill bytes and shared memory of every kernel a call runs, compiled for a GPU on
a machine without one: Triton compiles ahead of time for a target (`GPUTarget`), and the
CUDA toolkit's `cuobjdump` bundled with Triton reads the resources from the cubin.

The dK/dV kernel sits at the 255-register limit, and spills are what separated it from
hand-written kernels of the same design (bench/results/HISTORY-performance-to-20261129.md §6.7). This script shows what
an emitter change does to every kernel's registers without the GPU time it costs to compile
on one. Run it with the Triton the GPU has (the H200 image has 3.6; `pip install --target DIR
triton==3.6.0`, then `PYTHONPATH=DIR`) to get that GPU's numbers: code generation differs
between Triton versions.

    python bench/kernel_resources.py [--variant rope_causal] [--mode fwdbwd] [--head-dim 128]
        [--heads 32 --kv-heads 8] [--dtype bf16] [--capability 90] [--config F;B;KV]
        [--edit no-licm|dv-first|atomic-dq|atomic-dq-tma]

A call of the variant (B=1, N=256 by default; registers do not depend on N beyond N=1 and
divisibility by 16) is planned on the CPU with the tile configuration that GPU would get
(`CompiledAttention.tile_config(problem, capability)`, or `--config`). Its launches are recorded instead of
run, and each kernel of the GPU source for the same compile key is compiled with the
recorded arguments. One line per kernel: registers per thread, spill bytes per thread
(cuobjdump's STACK; Triton reports spills as the local-memory size / 4), and static shared
memory plus what Triton allocates dynamically.

`--edit` compiles a text edit of the dK/dV kernel instead (bench/dkdv_emitted_variants.py,
bench/dkdv_atomic_dq.py): a candidate's registers before any GPU time is spent on it. The
atomic-dQ edits take an fp32 dQ buffer as an extra argument, which is passed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import torch
import triton
from dkdv_atomic_dq import with_atomic_dq  # bench/ is the script's directory
from dkdv_emitted_variants import dv_first, load_kernel, variant_source_one
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

import attnfuse as af
from attnfuse.runtime.compiler import generate_program
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import check_inputs
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.tools.bench import DTYPES, VARIANTS

EDITS = {
    "no-licm": lambda source: variant_source_one(source, "no-licm"),
    "dv-first": dv_first,
    "atomic-dq": lambda source: with_atomic_dq(source, tma=False),
    "atomic-dq-tma": lambda source: with_atomic_dq(source, tma=True),
}
"""Edits of the dK/dV kernel's source that `--edit` names."""
TAKES_DQ_BUFFER = {"atomic-dq", "atomic-dq-tma"}


class TargetOnlyDriver:
    """The part of Triton's active driver that ahead-of-time compiles ask for: a device, a
    stream and the target. Nothing is launched."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, _device: int) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target


def recorded_launches(fn, q, k, v, training: bool) -> list[tuple[KernelLaunch, dict[str, torch.Tensor]]]:
    """The launches a CPU call makes, with their tensors, recorded instead of run."""
    records = []
    original = KernelLaunch.__call__
    KernelLaunch.__call__ = lambda self, tensors: records.append((self, dict(tensors)))
    try:
        if training:
            fn(q, k, v).backward(torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype))
        else:
            with torch.no_grad():
                fn(q, k, v)
    finally:
        KernelLaunch.__call__ = original
    return records


def resources(cubin: bytes) -> dict[str, int]:
    """REG, STACK, SHARED and LOCAL of the cubin's one kernel, from cuobjdump -res-usage."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return {name: int(value) for name, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def parse_config(text: str) -> TileConfig:
    """`bm,bn,w,s;bm,bn,w,s;bm,bn,w,s` (forward; dQ; dK/dV) as a TileConfig."""
    parts = [int(x) for part in text.split(";") for x in part.split(",")]
    return TileConfig(*parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Bias variants are left out: their calls need a bias tensor, which this script does not pass.
    parser.add_argument("--variant", default="rope_causal",
                        choices=sorted(name for name, variant in VARIANTS.items() if not variant.bias))
    parser.add_argument("--mode", default="fwdbwd", choices=["fwd", "fwdbwd"])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--capability", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--config", help="tile configuration 'F;DQ;DKDV', each bm,bn,warps,stages")
    parser.add_argument("--edit", choices=sorted(EDITS), help="compile this edit of the dK/dV kernel")
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"  # the recorded CPU call plans for the interpreter
    dtype = DTYPES[args.dtype]
    spec = VARIANTS[args.variant].spec(af)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, h, args.seq_len, args.head_dim, dtype=dtype, requires_grad=args.mode == "fwdbwd")
               for h in (args.heads, args.kv_heads, args.kv_heads))
    capability = divmod(args.capability, 10)
    problem = check_inputs(spec, q, k, v)
    config = parse_config(args.config) if args.config else af.compile(spec).tile_config(problem, capability)
    fn = af.compile(spec, config=config)
    training = args.mode == "fwdbwd"
    records = recorded_launches(fn, q, k, v, training)
    key, _compiled = fn.compiled_for(problem, (False, False), training)
    program, _path, _digest = generate_program(spec, key, interpret=False)
    source = EDITS[args.edit](program.source) if args.edit else program.source

    os.environ["TRITON_INTERPRET"] = "0"  # the GPU source's kernels: real JIT functions
    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", args.capability, 32)))
    print(f"# Triton {triton.__version__}, sm_{args.capability}; {args.variant} {args.mode} "
          f"B=1 Hq={args.heads} Hkv={args.kv_heads} D={args.head_dim} N={args.seq_len} {args.dtype}; {config}"
          + (f"; dK/dV edit {args.edit}" if args.edit else ""))
    for launch, tensors in records:
        # The interpreter keeps bf16 rotated copies in fp32; the GPU's are in the input dtype.
        tensors = {role: t.to(dtype) if t.dtype == torch.float32 and role in ("q_rot", "k_rot") else t
                   for role, t in tensors.items()}
        kernel = load_kernel(source, launch.info.name)
        flags = {"SHARED_OFFSETS": launch.shares_offsets(tensors)} if launch.info.shared_offsets else {}
        extra = ()
        if args.edit in TAKES_DQ_BUFFER and launch.info.name == "attention_bwd_dkdv":
            extra = (torch.zeros(tensors["do"].shape, dtype=torch.float32),)
        compiled = kernel.warmup(*launch.arguments(tensors)[0], *extra, *launch.scalars, grid=(1,), **flags,
                                 num_warps=launch.info.num_warps, num_stages=launch.info.num_stages)
        used = resources(compiled.asm["cubin"])
        shared = max(used.get("SHARED", 0), compiled.metadata.shared)
        print(f"{launch.info.name:28s} {launch.info.block_m:4d} rows, {launch.info.num_warps} warps, "
              f"{launch.info.num_stages} stages: {used['REG']:3d} registers, {used['STACK']:4d} B spilled, "
              f"{shared:6d} B shared", flush=True)


if __name__ == "__main__":
    main()
