"""The compiler's Gluon fused backward beside the hand-written probe it follows
(bench/gluon_backward_probe.py, `wg2_writer_lse`), instruction by instruction, without a GPU:
both compiled ahead of time for sm_90 (Hopper), causal and dense, head dim 128, bf16. Per
kernel: registers and stack (cuobjdump), shared memory, the `setmaxnreg` of each partition,
and the SASS of the consumer's main loop (the backward branch's range holding the most
HGMMAs) counted by instruction class. Run it with the Triton the H200 has (3.6):

    PYTHONPATH=/tmp/lead/t36:. python bench/gluon_backward_sass.py [--cases causal,dense]
        [--dump DIR]     # also write each kernel's source, PTX and loop SASS to DIR
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLASSES = [
    ("HGMMA", r"^HGMMA"),
    ("WARPGROUP", r"^WARPGROUP\.(ARRIVE|DEPBAR)"),
    ("WARPSYNC", r"^WARPSYNC"),
    ("SYNCS", r"^SYNCS"),
    ("BAR", r"^BAR\b"),
    ("MUFU.EX2", r"^MUFU\.EX2"),
    ("FMUL", r"^FMUL"),
    ("FFMA", r"^FFMA"),
    ("FADD", r"^FADD"),
    ("F2F/F2FP", r"^F2FP?\b|^F2FP\."),
    ("FSEL/SEL", r"^F?SEL\b"),
    ("FSETP/ISETP", r"^[FI]SETP"),
    ("PLOP3/P2R/R2P", r"^(PLOP3|P2R|R2P)"),
    ("BRA", r"^BRA\b"),
    ("LDS/LDSM", r"^LDS"),
    ("STS/STSM", r"^STS"),
    ("MOV/SHFL/PRMT", r"^(MOV|SHFL|PRMT)"),
    ("FENCE", r"^FENCE"),
    ("UTMA/UBLKCP", r"^(UTMA|UBLKCP)"),
    ("int/other", r""),
]
"""Instruction classes, first match wins; the last takes the rest."""

SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def sass_of(cubin: bytes, flag: str = "-sass") -> str:
    """What Triton's bundled cuobjdump prints for `cubin`."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def instructions(sass: str) -> list[tuple[int, str, bool]]:
    """(address, instruction text without its predicate, whether it had one) of every SASS
    instruction."""
    out = []
    for line in sass.splitlines():
        m = SASS_LINE.search(line)
        if m:
            raw = m.group(2).strip()
            text = re.sub(r"^@!?U?P[T0-9]+\s+", "", raw)
            out.append((int(m.group(1), 16), text, text != raw))
    return out


def main_loop(insts: list[tuple[int, str]]) -> tuple[int, int]:
    """The address range [start, end] of the consumer's main loop: of the ranges a backward
    branch closes, the one holding the most HGMMAs (the smallest of those)."""
    best = None
    for addr, text, _ in insts:
        m = re.match(r"BRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        hgmma = sum(1 for a, t, _ in insts if target <= a <= addr and t.startswith("HGMMA"))
        key = (hgmma, -(addr - target))
        if best is None or key > best[0]:
            best = (key, (target, addr))
    assert best is not None and best[0][0] > 0, "no loop with HGMMAs"
    return best[1]


def classify(text: str) -> str:
    opcode = text.split()[0]
    for name, pattern in CLASSES:
        if re.match(pattern, opcode):
            return name
    return "int/other"


def skipped(body: list[tuple[int, str, bool]]) -> set[int]:
    """Addresses a full (unmasked) step jumps over: the code between a predicated forward
    branch inside the loop and its target (the masks under their loop's test; in the
    probe, the causal mask under its diagonal test)."""
    end = body[-1][0]
    out: set[int] = set()
    for addr, text, predicated in body:
        m = re.match(r"BRA\b.*?(0x[0-9a-f]+)", text)
        if m and predicated and addr < int(m.group(1), 16) <= end:
            out |= {a for a, _, _ in body if addr < a < int(m.group(1), 16)}
    return out


def loop_counts(sass: str, loop=main_loop) -> tuple[Counter, Counter, list[str]]:
    """Counts by class of the main loop's instructions (the range `loop` finds, `main_loop`
    unless given), all of them and those a full step runs (`skipped` left out), and the
    loop's SASS."""
    insts = instructions(sass)
    start, end = loop(insts)
    body = [i for i in insts if start <= i[0] <= end]
    skip = skipped(body)
    every = Counter(classify(t) for _, t, _ in body)
    every["total"] = len(body)
    steady = Counter(classify(t) for a, t, _ in body if a not in skip)
    steady["total"] = len(body) - len(skip)
    lines = [f"/*{a:04x}*/ {'  (masked) ' if a in skip else ''}{t}" for a, t, _ in body]
    return every, steady, lines


def resources(compiled) -> dict[str, object]:
    text = sass_of(compiled.asm["cubin"], "-res-usage")
    ptx = compiled.asm["ptx"]
    return {
        "REG": int(re.search(r"REG:(\d+)", text).group(1)),
        "STACK": int(re.search(r"STACK:(\d+)", text).group(1)),
        "shared": compiled.metadata.shared,
        "setmaxnreg": sorted({int(x) for x in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}),
    }


def compile_probe(causal: bool):
    from gluon_backward_probe import _warmup

    return _warmup("wg2_writer_lse", causal)[0][1]


def compile_attnfuse(causal: bool):
    """The runtime's kernel for the case: the fused backward of the spec after
    warp-specialize, warmed up with CPU descriptors (n = 256, the Llama-3-8B heads)."""
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
    dim = 128
    key = CompileKey(dim, dim, "bf16", TileConfig(64, 64, 4, 2), None, bwd_rope="pre_rotated", bwd_dq="fused")
    module = lower_spec(spec, key)
    WarpSpecializePass().apply(make_context(), module)
    kernel = next(op for op in module.ops if op.sym_name.data == "attention_bwd_dkdv_dq")
    program = emit_gluon_kernel(kernel)
    info = program.kernels[0]
    fn = getattr(gluon_forward._gluon_module(program.source), "attention_bwd_dkdv_dq")
    n, heads, heads_kv = 256, 32, 8
    q = torch.empty(1, heads, n, dim, dtype=torch.bfloat16)
    kv = torch.empty(1, heads_kv, n, dim, dtype=torch.bfloat16)
    acc = torch.empty(1, heads, n, dim)
    rows_flat = torch.empty(heads * n)

    def desc(t, rows, dtype=gl.bfloat16):
        block = [1, 1, rows, dim]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, dtype))

    row_layout = gl.NVMMASharedLayout.get_default_for([info.block_n], gl.float32)
    descs = [desc(q, info.block_n), desc(kv, info.block_m), desc(kv, info.block_m), desc(q, info.block_n),
             desc(kv, info.block_m), desc(kv, info.block_m), desc(acc, info.block_n, gl.float32),
             *(TensorDescriptor(rows_flat, [heads * n], [1], [info.block_n], row_layout) for _ in range(2))]
    pointers = [kv, *kv.stride()]  # dk's pointer and strides (the roles the descriptors leave)
    assert [r for r in info.roles if r not in (*info.operands, "dv", "dq_acc", "lse", "delta")] == ["dk"]
    compiled = fn.warmup(*descs, *pointers, 0.088, n, n, heads_kv, heads // heads_kv, grid=(1,),
                         num_warps=info.num_warps)
    return compiled, program.source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="causal,dense")
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
        causal = case == "causal"
        kernels = [("attnfuse", *compile_attnfuse(causal))]
        if not args.no_probe:
            kernels.append(("probe", compile_probe(causal), None))
        for who, compiled, source in kernels:
            sass = sass_of(compiled.asm["cubin"])
            every, steady, body = loop_counts(sass)
            res = resources(compiled)
            res["loop"], res["LDL/STL"] = every["total"], sum(1 for line in body if re.search(r"\b(LDL|STL)\b", line))
            rows.append((f"{case} {who}", res, steady))
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                stem = os.path.join(args.dump, f"{case}-{who}")
                with open(stem + ".loop.sass", "w") as f:
                    f.write("\n".join(body) + "\n")
                with open(stem + ".sass", "w") as f:
                    f.write(sass)
                with open(stem + ".ptx", "w") as f:
                    f.write(compiled.asm["ptx"])
                if source:
                    with open(stem + ".py", "w") as f:
                        f.write(source)
    print_tables(rows, columns)


def print_tables(rows: list[tuple[str, dict, Counter]], columns: list[str]) -> None:
    """The markdown tables of a run: resources per kernel, then a full step's SASS by class."""
    print("| kernel | REG | STACK | shared B | setmaxnreg | loop instructions (all) | LDL/STL in loop |")
    print("|---|---|---|---|---|---|---|")
    for label, res, _ in rows:
        print(f"| {label} | {res['REG']} | {res['STACK']} | {res['shared']} | {res['setmaxnreg']} | {res['loop']} "
              f"| {res['LDL/STL']} |")
    print()
    print("Consumer main loop, SASS instructions a full (unmasked) step runs, by class:")
    print()
    print("| class | " + " | ".join(label for label, _, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for column in columns:
        print(f"| {column} | " + " | ".join(str(counts.get(column, 0)) for _, _, counts in rows) + " |")


if __name__ == "__main__":
    main()
