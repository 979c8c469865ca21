"""The compiler's Gluon forward beside the hand-written ping-pong probe it follows
(bench/gluon_forward_probe.py, `attention_fwd_pp`: `pp2` at head dim 128, `pp3` at 64),
instruction by instruction, without a GPU: both compiled ahead of time for sm_90 (Hopper).
Cases: causal and dense at head dim 128, bf16, two consumer warpgroups; causal and dense at
head dim 64, fp16 ("f16"), three. Per kernel: registers and stack (cuobjdump), shared memory, the
`setmaxnreg` of each partition, and the SASS of the first consumer's key loop (`key_loop`) counted by instruction class, with
`bench/gluon_backward_sass.py`'s functions. Run it with the Triton the H200 has (3.6):

    PYTHONPATH=/tmp/lead/t36:. python bench/gluon_forward_sass.py [--cases causal128,dense128,causal64,dense64]
        [--dump DIR]     # also write each kernel's source, PTX and loop SASS to DIR
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gluon_backward_sass import CLASSES, loop_counts, print_tables, resources, sass_of  # noqa: E402


def key_loop(insts: list[tuple[int, str, bool]]) -> tuple[int, int]:
    """The address range [start, end] of the first consumer's key loop: the first range a
    predicated backward branch closes that holds HGMMAs and exponentials. (The backward's
    `main_loop`, the range with the most HGMMAs, would take in the mbarrier waits' retry
    loops, which ptxas places after the kernel's exit and close with backward branches to
    the wait.)"""
    for addr, text, predicated in insts:
        m = re.match(r"BRA\b.*?(0x[0-9a-f]+)", text)
        if not (m and predicated and int(m.group(1), 16) < addr):
            continue
        target = int(m.group(1), 16)
        body = [t for a, t, _ in insts if target <= a <= addr]
        if any(t.startswith("HGMMA") for t in body) and any(t.startswith("MUFU.EX2") for t in body):
            return target, addr
    raise AssertionError("no key loop with HGMMAs and exponentials")

CASES = {
    # name: (causal, head dim, dtype, consumers, probe variant)
    "causal128": (True, 128, "bf16", 2, "pp2"),
    "dense128": (False, 128, "bf16", 2, "pp2"),
    "causal64": (True, 64, "f16", 3, "pp3"),
    "dense64": (False, 64, "f16", 3, "pp3"),
}


def compile_probe(causal: bool, dim: int, dtype: str, variant: str):
    import torch
    from gluon_forward_probe import _warmup_args

    return _warmup_args(variant, dim, causal, torch.bfloat16 if dtype == "bf16" else torch.float16)


def compile_attnfuse(causal: bool, dim: int, dtype: str, consumers: int, source: str | None = None):
    """The runtime's forward kernel for the case after warp-specialize with the schedule's
    options, warmed up with CPU descriptors (n = 8192, the Llama-3-8B heads at head dim 128);
    `source` in place of the printed kernel's text (an edit to try) when given."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    import attnfuse as af
    from attnfuse.dialects import make_context
    from attnfuse.lowering.gluon import emit_gluon_kernel
    from attnfuse.runtime import gluon_forward
    from attnfuse.runtime.compiler import CompileKey, lower_spec
    from attnfuse.runtime.config import TileConfig
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    spec = af.attention(af.causal()) if causal else af.attention()
    key = CompileKey(dim, dim, dtype, TileConfig(64, 64, 4, 2), ("fused", "fused"))
    module = lower_spec(spec, key)
    WarpSpecializePass(**gluon_forward.SCHEDULES[dim].options(consumers, False)).apply(make_context(), module)
    kernel = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    program = emit_gluon_kernel(kernel)
    info = program.kernels[0]
    source = source or program.source
    fn = gluon_forward._gluon_module(source).attention_fwd
    torch_dtype, gl_dtype = (torch.bfloat16, gl.bfloat16) if dtype == "bf16" else (torch.float16, gl.float16)
    n, heads, heads_kv = 8192, 32, 8
    q = torch.empty(1, heads, n, dim, dtype=torch_dtype)
    kv = torch.empty(1, heads_kv, n, dim, dtype=torch_dtype)

    def desc(t, rows):
        block = [1, 1, rows, dim]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, gl_dtype))

    descs = [desc(q, 64), desc(kv, info.block_n), desc(kv, info.block_n), desc(q, 64)]
    lse = torch.empty(1, heads, n)
    pointers = []
    for role in info.roles:
        if role not in info.operands:
            assert role == "lse", role
            pointers += [lse, *lse.stride()]
    compiled = fn.warmup(*descs, *pointers, 0.088, n, n, heads_kv, heads // heads_kv, grid=(1,), num_warps=4)
    return compiled, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dump", default=None, help="write sources, PTX and loop SASS here")
    parser.add_argument("--no-probe", action="store_true")
    args = parser.parse_args()
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from kernel_resources import TargetOnlyDriver

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    columns = [name for name, _ in CLASSES] + ["total"]
    rows = []
    for case in args.cases.split(","):
        causal, dim, dtype, consumers, variant = CASES[case]
        kernels = [("attnfuse", *compile_attnfuse(causal, dim, dtype, consumers))]
        if not args.no_probe:
            kernels.append(("probe", compile_probe(causal, dim, dtype, variant), None))
        for who, compiled, source in kernels:
            sass = sass_of(compiled.asm["cubin"])
            every, steady, body = loop_counts(sass, key_loop)
            res = resources(compiled)
            res["loop"], res["LDL/STL"] = every["total"], sum(1 for line in body if re.search(r"\b(LDL|STL)\b", line))
            rows.append((f"{case} {who}", res, steady))
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                stem = os.path.join(args.dump, f"{case}-{who}")
                for suffix, text in ((".loop.sass", "\n".join(body) + "\n"), (".sass", sass),
                                     (".ptx", compiled.asm["ptx"]), (".py", source)):
                    if text:
                        with open(stem + suffix, "w") as f:
                            f.write(text)
    print_tables(rows, columns)


if __name__ == "__main__":
    main()
