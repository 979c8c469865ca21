"""Edits of the emitted dK/dV kernel, timed against the unedited one: an experiment on the
compiler's output, to find what makes it spill more than a hand-written kernel of the same
structure (bench/dkdv_formulations.py --ablation).

Plain causal attention at the Llama-3-8B geometry (N=4096, Hq=32, Hkv=8, D=128, bf16). Each
edit is a text substitution on the generated Triton source, valid for these contiguous
inputs only:

- `shared-offsets`: dO's pointers reuse q's offsets (one address tensor per loop step
  instead of two). The compiler now emits this as the `SHARED_OFFSETS` branch, which the
  runtime takes for these contiguous inputs; the edit then only rewrites the unused branch;
- `dv-first`: dV's product is accumulated before dP is computed (the hand-written order);
- `no-licm`: the query-block loops are `tl.range(..., disable_licm=True)`, so that nothing
  is hoisted out of them to live across the loop (fewer long-lived registers);
- `flatten`: the loop over the GQA group's heads is `tl.range(..., flatten=True)`, one
  pipelined loop instead of a pipeline restarted per head and band;
- `tma`: loop operands (q and dO in dK/dV; k and v in the forward and dQ) read through
  on-device tensor descriptors (TMA);
- `fold-scale` (what the compiler emits since 6808ad5, so the edit no longer applies): the
  score scale is not applied to the scores but folded into the exp2 argument's multiplier (`s * (scale * log2 e) - m`, one FMA instead of a multiply and an
  FMA per score) and into the row max (`max(s) * scale`, valid as the scale is positive);
- `ws`: the first key loop of the forward / dQ kernel (the full blocks, no masking) is
  `tl.range(..., warp_specialize=True)`: Triton's Hopper warp specialization (a producer
  warp loading, consumer warpgroups computing); with `tma`, the loads it specializes are
  tensor-descriptor loads;
- combinations of them.

`--kernel attention_fwd` or `attention_bwd_dq` tries `tma` on those kernels. (An `lpt` edit,
the grid read block-major so that every head's longest programs start first, measured
30% less time for dK/dV, 10% for dQ and 7% for the forward and is now what the compiler emits:
bench/results/20261129T1725Z-emitted_variants-lpt.log.)

    python bench/dkdv_emitted_variants.py [--configs 64,64,4,2;64,32,4,3]

With `--cpu` it runs a small problem in Triton's interpreter instead, to check that every
edit still computes the same dK and dV (the interpreter ignores the loop attributes).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import tempfile

import torch
import triton

import attnfuse as af
from attnfuse.runtime.compiler import generate_program
from attnfuse.runtime.inputs import check_inputs

DO_POINTERS = re.compile(r"do_base \+ queries\[:, None\] \* stride_do_n \+ \(cols_dv\)\[None, :\] \* stride_do_d")
SAME_AS_Q = "do_base + queries[:, None] * stride_q_n + (cols_d)[None, :] * stride_q_d"


def dv_first(source: str) -> str:
    """In the dK/dV kernel, moves each loop body's `dv = tl.dot(...)` above its
    `tile.dot_transposed` (the dP product)."""
    head, rest = source.split("def attention_bwd_dkdv(", 1)
    body, tail = rest.split("\n@triton.jit", 1)
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"\s*# tile.dot_transposed", lines[i]):
            j = next(j for j in range(i, len(lines)) if re.match(r"\s*dv = tl.dot\(", lines[j]))
            lines.insert(i, lines.pop(j))
            i += 1  # past the moved line, onto the comment
        i += 1
    return head + "def attention_bwd_dkdv(" + "\n".join(lines) + "\n@triton.jit" + tail


QUERY_LOOPS = re.compile(r"for start_m in range\(([^,]+), ([^,]+), BLOCK_N\):")
HEAD_LOOPS = re.compile(r"for head_in_group in range\(0, group_size\):")
LOOP_LOADS = re.compile(
    r"(?P<var>\w+) = tl\.load\((?P<role>\w+)_base \+ (?P<index>queries|keys)\[:, None\] \* stride_(?P=role)_n"
    r" \+ \((?P<cols>cols_\w+)\)\[None, :\] \* stride_(?P=role)_d(?:, mask=\w+\[:, None\], other=0\.0)?\)")
EDITS = [set(), {"shared-offsets"}, {"dv-first"}, {"no-licm"}, {"flatten"},
         {"shared-offsets", "dv-first"}, {"shared-offsets", "dv-first", "no-licm"}, {"tma"},
         {"tma", "dv-first"}, {"tma", "no-licm"}, {"fold-scale"}, {"fold-scale", "tma"},
         {"fold-scale", "shared-offsets"}]
OTHER_KERNEL_EDITS = [set(), {"tma"}, {"ws"}, {"tma", "ws"}]
FIRST_KEY_LOOP = re.compile(r"for start_n in range\(([^,]+), ([^,]+), BLOCK_N\):")
"""Edits tried on the forward and dQ kernels (the others are specific to dK/dV)."""
LOOP_START = {"queries": "start_m", "keys": "start_n"}
LOOP_ROWS = {"queries": "n_q", "keys": "n_k"}
COLUMN_BLOCKS = {"cols_d": ("HEAD_DIM", "BLOCK_D"), "cols_dv": ("HEAD_DIM_V", "BLOCK_DV")}


def tensor_descriptor_loads(source: str) -> str:
    """`kernel_descriptor_loads` applied to each kernel of the source."""
    return "\n@triton.jit".join(kernel_descriptor_loads(part) for part in source.split("\n@triton.jit"))


def kernel_descriptor_loads(source: str) -> str:
    """Every full-width row-block load inside a loop (q and dO in dK/dV; k and v in the
    forward and dQ) read through a tensor descriptor made where the role's base pointer is
    (TMA on Hopper: no per-element addresses in registers; rows past the end read as 0, as
    the masked loads' `other=0.0`). Needs a unit column stride and 16-byte aligned rows."""
    roles = {}

    def load(match: re.Match) -> str:
        role, index, cols = match["role"], match["index"], match["cols"]
        roles[role] = (index, cols)
        return f"{match['var']} = {role}_desc.load([{LOOP_START[index]}, 0])"

    source = LOOP_LOADS.sub(load, source)
    for role, (index, cols) in roles.items():
        dim, block = COLUMN_BLOCKS[cols]
        base = re.compile(rf"^(?P<indent> *){role}_base = .*$", re.MULTILINE)
        source = base.sub(
            lambda m, role=role, index=index, dim=dim, block=block: (
                f"{m[0]}\n{m['indent']}{role}_desc = tl.make_tensor_descriptor({role}_base, "
                f"shape=[{LOOP_ROWS[index]}, {dim}], strides=[stride_{role}_n, 1], "
                f"block_shape=[BLOCK_N, {block}])"), source)
    return source


SCALE_LINE = re.compile(r"^ *(\w+) = \1 \* sm_scale\n", re.MULTILINE)
EXP2_OF_SCORES = re.compile(r"tl\.math\.exp2\((scores\w*) \* 1\.4426950408889634 -")
MAX_OF_SCORES = re.compile(r"tl\.max\((scores\w*), 1\)")


def fold_scale(source: str) -> str:
    """Each kernel's `scores = scores * sm_scale` dropped; the scale applied instead where the
    scores meet the exponential (`exp2(s * (sm_scale * log2 e) - ...)`) and the row max
    (`max(s) * sm_scale`). Masks (`where(keep, s, -inf)`) commute with a positive scale."""
    source, count = SCALE_LINE.subn("", source)
    if not count:
        return source  # the compiler folds the scale itself now (6808ad5): nothing to edit
    source = EXP2_OF_SCORES.sub(r"tl.math.exp2(\1 * (sm_scale * 1.4426950408889634) -", source)
    return MAX_OF_SCORES.sub(r"(tl.max(\1, 1) * sm_scale)", source)


def in_dkdv(source: str, edit) -> str:
    """Applies `edit` (text -> text) to the dK/dV kernel's source only."""
    head, rest = source.split("def attention_bwd_dkdv(", 1)
    body, tail = rest.split("\n@triton.jit", 1)
    return head + "def attention_bwd_dkdv(" + edit(body) + "\n@triton.jit" + tail


def variant_source(source: str, edits: set[str]) -> str:
    """The emitted source with `edits` applied to its dK/dV kernel (each must change it)."""
    for edit in edits:
        if variant_source_one(source, edit) == source:
            raise ValueError(f"edit {edit} does not apply to this kernel")
    for edit in sorted(edits):
        source = variant_source_one(source, edit)
    return source


def variant_source_one(source: str, edit: str) -> str:
    """The source with one named edit applied."""
    edits = {edit}
    if "shared-offsets" in edits:
        source, count = DO_POINTERS.subn(SAME_AS_Q, source)
        assert count, "no dO pointer expression found"
    if "dv-first" in edits:
        source = dv_first(source)
    if "no-licm" in edits:
        source = in_dkdv(source, lambda body: QUERY_LOOPS.sub(
            r"for start_m in tl.range(\1, \2, BLOCK_N, disable_licm=True):", body))
    if "tma" in edits:
        source = tensor_descriptor_loads(source)
    if "fold-scale" in edits:
        source = fold_scale(source)

    if "ws" in edits:
        source = "\n@triton.jit".join(FIRST_KEY_LOOP.sub(  # each kernel's first key loop
            r"for start_n in tl.range(\1, \2, BLOCK_N, warp_specialize=True):", part, count=1)
            for part in source.split("\n@triton.jit"))
    if "flatten" in edits:
        source = in_dkdv(source, lambda body: HEAD_LOOPS.sub(
            "for head_in_group in tl.range(0, group_size, flatten=True):", body))
    return source


def load_kernel(source: str, name: str):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"dkdv_variant_{abs(hash(source))}", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


KERNEL_OUTPUTS = {"attention_fwd": ("o",), "attention_bwd_dq": ("dq",), "attention_bwd_dkdv": ("dk", "dv")}
KERNEL_PRODUCTS = {"attention_fwd": 2, "attention_bwd_dq": 3, "attention_bwd_dkdv": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configs", default="64,64,4,2;64,32,4,3",
                        help="tile configs of the timed kernel (the others keep a fixed one)")
    parser.add_argument("--kernel", default="attention_bwd_dkdv", choices=sorted(KERNEL_OUTPUTS))
    parser.add_argument("--cpu", action="store_true", help="check the edits in the interpreter")
    parser.add_argument("--edits", help="edit sets to time, ';'-separated, edits of a set joined by "
                        "'+' (default: all of the kernel's); 'emitted' is the unedited kernel")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    # The interpreter's length is ragged (not a multiple of any block): padded rows must read 0.
    n, d, hq, hkv = (90, 32, 4, 2) if args.cpu else (4096, 128, 32, 8)
    dtype = torch.float16 if args.cpu else torch.bfloat16
    # On-device tensor descriptors need scratch memory for the descriptors themselves.
    triton.set_allocator(lambda size, _align, _stream: torch.empty(size, dtype=torch.int8, device=device))
    torch.manual_seed(0)
    q = torch.randn(1, hq, n, d, device=device, dtype=dtype)
    k = torch.randn(1, hkv, n, d, device=device, dtype=dtype)
    v = torch.randn(1, hkv, n, d, device=device, dtype=dtype)
    grad_out = torch.randn_like(q)
    spec = af.attention(af.causal())
    flops = KERNEL_PRODUCTS[args.kernel] * 2 * hq * n * n * d / 2
    outputs = KERNEL_OUTPUTS[args.kernel]
    edit_sets = EDITS if args.kernel == "attention_bwd_dkdv" else OTHER_KERNEL_EDITS
    if args.edits:
        edit_sets = [set() if text == "emitted" else set(text.split("+")) for text in args.edits.split(";")]
    for text in args.configs.split(";"):
        cfg = tuple(int(x) for x in text.split(","))
        configs = {"attention_fwd": (64, 64, 4, 3), "attention_bwd_dq": (64, 64, 4, 2),
                   "attention_bwd_dkdv": (64, 32, 4, 3)} | {args.kernel: cfg}
        fn = af.compile(spec, config=af.TileConfig(*configs["attention_fwd"], *configs["attention_bwd_dq"],
                                                   *configs["attention_bwd_dkdv"]))
        plan = fn.plan(q, k, v)
        out, lse = fn.forward(plan, {}, q, k, v)
        delta = (out.float() * grad_out.float()).sum(-1)
        base = {"q": q, "k": k, "v": v, "o": out, "lse": lse, "do": grad_out, "delta": delta}
        launch = next(x for x in plan.launches if x.info.name == args.kernel)
        program, _path, _key = generate_program(spec, fn.compile_key(check_inputs(spec, q, k, v)), args.cpu)
        line = [f"{args.kernel} cfg={cfg}"]
        reference = None
        for edits in edit_sets:
            name = "+".join(sorted(edits)) or "emitted"
            try:
                kernel = load_kernel(variant_source(program.source, edits), args.kernel)
                variant = dataclasses.replace(launch, kernel=kernel, runners={}, stages=[launch.info.num_stages])
                tensors = base | {role: torch.full_like(base[role[1:]], float("nan")) for role in ("dq", "dk", "dv")}
                tensors |= {"o": torch.full_like(out, float("nan")), "lse": lse.clone()}
                variant(tensors)
                if reference is None:
                    reference = [tensors[r].float() for r in outputs]
                err = max(((tensors[r].float() - ref).norm() / ref.norm()).item()
                          for r, ref in zip(outputs, reference))
                if args.cpu:
                    line.append(f"{name} diff {err:.0e}")
                    continue
                ms = triton.testing.do_bench(lambda v=variant, t=tensors: v(t), warmup=10, rep=50, return_mode="median")
                compiled = variant.launch_jit(variant.arguments(tensors)[0], variant.shares_offsets(tensors))
                line.append(f"{name} {ms:.4f} ms {flops / ms / 1e9:.0f} TF/s "
                            f"{compiled.n_regs}r/{compiled.n_spills}s diff {err:.0e}")
            except Exception as err:  # an edit that does not apply or compile
                line.append(f"{name} failed ({type(err).__name__}: {str(err)[:80]})")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
