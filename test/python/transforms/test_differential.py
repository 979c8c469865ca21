"""Differential test: random attn IR programs, compiled, against the attn-IR interpreter.

Hypothesis draws whole attn programs as text: an optional rotation of q and k, `attn.scores`
(maybe with a static scale), a chain of up to five score ops in any order and with repeats
(`attn.alibi`, `attn.add_bias`, `attn.softcap`, `attn.mask` with causal / window / no
predicates, at most one `attn.block_sparse` and one `attn.document`), dead branches (score ops whose result nothing
reads, which the kernels must ignore) and a normalizer (softmax, relu or sigmoid). Each
program is compiled with `af.compile(ir_text)`, run through the generated kernels (Triton's
interpreter on the CPU) on small random tensors, and compared with
`af.reference_attention(ir_text, ...)`, which interprets the same text op by op in float64:
the output, the log-sum-exp (softmax), and for a fraction of fp32 examples the gradients of
q, k, v (and the bias). Facts about the compiler's tile IR are checked too: every loop body
applies as many `tile.alibi` / `tile.add_bias` as the path from the scores to the
normalizer holds, and a program with no ALiBi on that path reads no slopes at all.

Derandomized, so CI runs the same examples every time; a failure prints the IR.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("hypothesis")

from conftest import LSE_ATOL, assert_close_to_reference, assert_lse_close, make_qkv  # noqa: E402
from hypothesis import HealthCheck, example, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse.runtime.reference import gradient_errors, reference_gradients  # noqa: E402

pytestmark = pytest.mark.interpreter

GRAD_TOLERANCE = 1e-4
"""Relative L2 error of each fp32 gradient against the float64 reference."""

BLOCK_SIZES = (16, 32)


# --------------------------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------------------------


def f64(x: float) -> str:
    """A float attribute as attn IR text."""
    return f"{x:.6e} : f64"


@dataclass(frozen=True)
class ScoreOp:
    """One score op of a program: `kind` and its parameter (ALiBi's explicit slopes or None,
    the soft-cap, a mask's predicate list as text, the block-sparse block size)."""

    kind: str
    param: object = None

    def text(self, result: str, operand: str) -> str:
        if self.kind == "alibi":
            if self.param is None:
                return f"{result} = attn.alibi {operand}"
            slopes = ", ".join(f64(s) for s in self.param)
            return f"{result} = attn.alibi {operand} {{slopes = [{slopes}]}}"
        if self.kind == "add_bias":
            return f"{result} = attn.add_bias {operand}, %bias"
        if self.kind == "softcap":
            return f"{result} = attn.softcap {operand} {{cap = {f64(self.param)}}}"
        if self.kind == "mask":
            return f"{result} = attn.mask {operand} {self.param}"
        if self.kind == "block_sparse":
            return f"{result} = attn.block_sparse {operand}, %layout {{block_size = {self.param} : i64}}"
        if self.kind == "document":
            return f"{result} = attn.document {operand}, %doc_ids"
        raise AssertionError(self.kind)


@dataclass(frozen=True)
class Program:
    """An attn program: rotation `(rotary_dim or None, interleaved)` or None, the score scale
    (None: 1/sqrt(D)), the score chain, dead branches `(source, ops)` (`source` indexes the
    chain's values: 0 is the scores, i the result of chain op i), the normalizer and the
    sigmoid's bias."""

    rope: tuple[int | None, bool] | None = None
    scale: float | None = None
    chain: tuple[ScoreOp, ...] = ()
    dead: tuple[tuple[int, tuple[ScoreOp, ...]], ...] = ()
    normalizer: str = "softmax"
    sigmoid_bias: float | None = None

    def ops(self) -> list[ScoreOp]:
        return [*self.chain, *(op for _src, ops in self.dead for op in ops)]

    @property
    def takes_bias(self) -> bool:
        return any(op.kind == "add_bias" for op in self.ops())

    @property
    def takes_layout(self) -> bool:
        return any(op.kind == "block_sparse" for op in self.ops())

    @property
    def takes_doc_ids(self) -> bool:
        return any(op.kind == "document" for op in self.ops())

    @property
    def block_size(self) -> int | None:
        return next((int(op.param) for op in self.chain if op.kind == "block_sparse"), None)  # type: ignore[arg-type]

    def on_path(self, kind: str) -> int:
        """How many ops of `kind` lie on the path from the scores to the normalizer."""
        return sum(op.kind == kind for op in self.chain)

    def ir(self) -> str:
        args = ["%q : !attn.query", "%k : !attn.key", "%v : !attn.value"]
        if self.takes_bias:
            args.append("%bias : !attn.bias")
        if self.takes_layout:
            args.append("%layout : !attn.layout")
        if self.takes_doc_ids:
            args.append("%doc_ids : !attn.doc_ids")
        lines = []
        q, k = "%q", "%k"
        if self.rope is not None:
            rotary_dim, interleaved = self.rope
            attrs = ["theta = 1.000000e+04 : f64"]
            if rotary_dim is not None:
                attrs.append(f"rotary_dim = {rotary_dim} : i64")
            if interleaved:
                attrs.append("interleaved")
            attrs_text = "{" + ", ".join(attrs) + "}"
            lines.append(f"%qr = attn.rope %q {attrs_text} : !attn.query")
            lines.append(f"%kr = attn.rope %k {attrs_text} : !attn.key")
            q, k = "%qr", "%kr"
        scale = "" if self.scale is None else f" {{scale = {f64(self.scale)}}}"
        lines.append(f"%s0 = attn.scores {q}, {k}{scale}")
        dead_count = 0

        def emit_dead(source: int) -> None:
            nonlocal dead_count
            for src, ops in self.dead:
                if src != source:
                    continue
                operand = f"%s{source}"
                for op in ops:
                    result = f"%dead{dead_count}"
                    dead_count += 1
                    lines.append(op.text(result, operand))
                    operand = result

        emit_dead(0)
        for i, op in enumerate(self.chain, start=1):
            lines.append(op.text(f"%s{i}", f"%s{i - 1}"))
            emit_dead(i)
        attrs = "" if self.sigmoid_bias is None else f" {{bias = {f64(self.sigmoid_bias)}}}"
        lines.append(f"%p = attn.{self.normalizer} %s{len(self.chain)}{attrs}")
        lines.append("%o = attn.pv %p, %v")
        lines.append("attn.yield %o")
        body = "\n".join(f"  {line}" for line in lines)
        return f"attn.variant @random({', '.join(args)}) -> !attn.output {{\n{body}\n}}\n"


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

SLOPE = st.floats(-0.5, 1.0, allow_nan=False, allow_subnormal=False).map(lambda x: round(x, 3))
CAP = st.sampled_from([0.5, 1.0, 2.0, 5.0, 20.0])


def mask_predicates() -> st.SearchStrategy[str]:
    window = st.integers(1, 50)
    return st.one_of(
        st.just("[#attn.causal]"),
        window.map(lambda w: f"[#attn.window<{w}>]"),
        st.just("[]"),
        window.map(lambda w: f"[#attn.causal, #attn.window<{w}>]"),
    )


def score_ops(hq: int, kinds: list[str]) -> st.SearchStrategy[ScoreOp]:
    """One score op of the given kinds; explicit ALiBi slopes are one per query head."""
    makers = {
        "alibi": st.one_of(st.none(), st.lists(SLOPE, min_size=hq, max_size=hq).map(tuple)),
        "add_bias": st.none(),
        "softcap": CAP,
        "mask": mask_predicates(),
        "block_sparse": st.sampled_from(BLOCK_SIZES),
        "document": st.none(),
    }
    return st.one_of(*(st.builds(ScoreOp, st.just(kind), makers[kind]) for kind in kinds))


@st.composite
def programs(draw, hq: int) -> Program:
    rope = draw(st.one_of(st.none(), st.tuples(st.sampled_from([None, 8]), st.booleans())))
    scale = draw(st.sampled_from([None, 0.3, 0.125]))
    chain = draw(st.lists(score_ops(hq, ["alibi", "add_bias", "softcap", "mask", "block_sparse",
                                         "document"]),
                          max_size=5))
    # At most one block-sparse layout and one document filter on the path: later ones become
    # full masks.
    seen: set[str] = set()
    fixed = []
    for op in chain:
        if op.kind in ("block_sparse", "document"):
            if op.kind in seen:
                op = ScoreOp("mask", "[]")
            seen.add(op.kind)
        fixed.append(op)
    seen_sparse = "block_sparse" in seen
    chain = tuple(fixed)
    # Dead branches: ops whose results nothing on the path reads. A dead add_bias or
    # block_sparse only where the path reads the same call-time tensor (the cases draw data
    # for what the path reads); test_dead_op_alone_reads_call_time_data covers a dead op
    # that is the only reader.
    dead_kinds = ["alibi", "softcap", "mask"]
    if any(op.kind == "add_bias" for op in chain):
        dead_kinds.append("add_bias")
    if seen_sparse:
        dead_kinds.append("block_sparse")
    if "document" in seen:
        dead_kinds.append("document")
    block_size = next((op.param for op in chain if op.kind == "block_sparse"), None)
    dead = draw(st.lists(
        st.tuples(st.integers(0, len(chain)),
                  st.lists(score_ops(hq, dead_kinds), min_size=1, max_size=2).map(tuple)),
        max_size=2,
    ))
    # A dead block_sparse reads the path's layout: it has the path's block size.
    dead = [(src, tuple(ScoreOp(op.kind, block_size) if op.kind == "block_sparse" else op for op in ops))
            for src, ops in dead]
    normalizer = draw(st.sampled_from(["softmax", "relu", "sigmoid"]))
    sigmoid_bias = draw(st.sampled_from([None, -1.0, 0.5])) if normalizer == "sigmoid" else None
    return Program(rope, scale, chain, tuple(dead), normalizer, sigmoid_bias)


@dataclass(frozen=True)
class Case:
    """A program and the call to run it on."""

    program: Program
    b: int = 1
    hkv: int = 1
    hq: int = 2
    nq: int = 24
    nk: int = 24
    d: int = 16
    dtype: torch.dtype = torch.float32
    q_scale: float = 2.0
    seed: int = 0
    bias_shape: tuple[int, ...] | None = None
    """Drawn as the broadcastable bias shape; None: the full [B, Hq, Nq, Nk]."""
    layout_per_head: bool = False
    layout_density: float = 0.6
    backward: bool = False
    bias_grad: bool = False
    lse_grad: bool = False


@st.composite
def cases(draw) -> Case:
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2]))
    program = draw(programs(hq))
    b, nq, nk = draw(st.integers(1, 2)), draw(st.integers(1, 48)), draw(st.integers(1, 48))
    dtype = draw(st.sampled_from([torch.float32] * 4 + [torch.float16, torch.bfloat16]))
    full = (b, hq, nq, nk)
    bias_shape = None
    if program.takes_bias:
        kept = draw(st.tuples(*(st.booleans() for _ in full)))
        shape = [n if keep else 1 for n, keep in zip(full, kept)]
        bias_shape = tuple(shape[draw(st.integers(0, 3)):])
    backward = dtype == torch.float32 and draw(st.integers(0, 2)) == 0
    return Case(
        program=program, b=b, hkv=hkv, hq=hq, nq=nq, nk=nk, d=draw(st.sampled_from([16, 32])),
        dtype=dtype, q_scale=draw(st.floats(0.5, 3.0)), seed=draw(st.integers(0, 2**16)),
        bias_shape=bias_shape,
        layout_per_head=draw(st.booleans()) if program.takes_layout else False,
        layout_density=draw(st.sampled_from([0.6, 0.3, 1.0, 0.0])) if program.takes_layout else 0.6,
        backward=backward,
        bias_grad=backward and program.takes_bias and draw(st.booleans()),
        lse_grad=backward and program.normalizer == "softmax" and draw(st.booleans()),
    )


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def inputs_of(case: Case) -> tuple[torch.Tensor, ...]:
    """q (scaled, so that soft-capping matters), k, v, and the bias and layout (or None)."""
    q, k, v = make_qkv(case.b, case.hq, case.hkv, case.nq, case.nk, case.d, dtype=case.dtype, seed=case.seed)
    q = (q.float() * case.q_scale).to(case.dtype)
    gen = torch.Generator().manual_seed(case.seed + 1)
    bias = layout = None
    if case.program.takes_bias:
        shape = case.bias_shape or (case.b, case.hq, case.nq, case.nk)
        bias = (2.0 * torch.randn(shape, generator=gen)).to(case.dtype)
    if case.program.takes_layout:
        bs = case.program.block_size or BLOCK_SIZES[0]
        rows, cols = -(-case.nq // bs), -(-case.nk // bs)
        shape = (case.hq, rows, cols) if case.layout_per_head else (rows, cols)
        layout = torch.rand(shape, generator=gen) < case.layout_density
    return q, k, v, bias, layout


def doc_ids_of(case: Case) -> torch.Tensor | None:
    """Packed documents of random lengths (1 to 20 keys) with padding runs (id -1), shared
    (`[Nk]`) or per sequence (`[B, Nk]`), when the program has a document filter."""
    if not case.program.takes_doc_ids:
        return None
    gen = torch.Generator().manual_seed(case.seed + 3)
    rows = []
    for _ in range(case.b if case.seed % 2 else 1):
        row: list[int] = []
        doc = 0
        while len(row) < case.nk:
            length = int(torch.randint(1, 21, (), generator=gen))
            padding = bool(torch.rand((), generator=gen) < 0.2)
            row += [-1 if padding else doc] * length
            doc += 1
        rows.append(row[: case.nk])
    return torch.tensor(rows if case.seed % 2 else rows[0])


def lse_atol(case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per-row lse tolerance `[B, Hq, Nq]`: 1e-3, plus for 16-bit inputs the score error of
    rounding each of the (rotated) q and k once to the input dtype, `2 eps scale |q_i|
    max_j |k_j|` (rotations keep norms). ALiBi and the bias add exact terms and a soft-cap
    is 1-Lipschitz, so no op of the chain widens it."""
    base = torch.full(q.shape[:3], LSE_ATOL, dtype=torch.float64)
    if case.dtype == torch.float32:
        return base
    qd, kd = q.double(), k.double()
    scale = case.program.scale if case.program.scale is not None else case.d ** -0.5
    eps = torch.finfo(case.dtype).eps
    k_max = kd.norm(dim=-1).amax(dim=-1).repeat_interleave(case.hq // case.hkv, dim=1)[..., None]
    return base + 2 * eps * scale * qd.norm(dim=-1) * k_max


LOOP = re.compile(r"= tile\.(sparse_)?(kv|q)_loop ")


def ops_per_loop_body(tile_ir: str, name: str) -> tuple[list[int], int]:
    """How often `name` appears in each loop body of the tile IR, and how often outside any."""
    per_body: list[int] = []
    outside = 0
    stack: list[bool] = []  # per open region: is it a loop body
    for line in tile_ir.splitlines():
        stripped = line.strip()
        if stripped == "}":
            stack.pop()
            continue
        if re.match(rf"(%[\w, %]+ = )?{re.escape(name)} ", stripped):
            if stack and stack[-1]:
                per_body[-1] += 1
            else:
                outside += 1
        if stripped.endswith("{"):
            is_loop = LOOP.search(stripped) is not None
            stack.append(is_loop)
            if is_loop:
                per_body.append(0)
    assert not stack, "unbalanced tile IR"
    return per_body, outside


def check_tile_ir(case: Case, fn: af.CompiledAttention, q, k, v) -> None:
    """Properties of the lowering: each loop body (forward and backward) applies every ALiBi
    and bias of the path once, as often as it appears; dead ops put nothing in any kernel."""
    tile_ir = fn.tile_ir(q, k, v)
    program = case.program
    if program.on_path("alibi") == 0:
        assert "slopes" not in tile_ir, "no ALiBi on the path, yet the kernels read slopes"
    else:
        assert "slopes" in tile_ir
    for kind in ("alibi", "add_bias"):
        per_body, outside = ops_per_loop_body(tile_ir, f"tile.{kind}")
        assert per_body, "no loop in the tile IR"
        assert outside == 0, f"tile.{kind} outside a loop body"
        expected = program.on_path(kind)
        assert set(per_body) == {expected}, (
            f"tile.{kind} per loop body: {per_body}, expected {expected} each"
        )


def check_gradients(case: Case, fn: af.CompiledAttention, ir: str, q, k, v, bias, layout) -> None:
    """Backward through the kernels against autograd through the float64 reference."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if bias is not None and case.bias_grad:
        bias = bias.detach().requires_grad_()
    call = {"bias": bias, "block_layout": layout, "doc_ids": doc_ids_of(case)}
    gen = torch.Generator().manual_seed(case.seed + 2)
    grad_lse = None
    if case.lse_grad:
        out, lse = fn(q, k, v, return_lse=True, **call)
        grad_out = torch.randn(out.shape, generator=gen)
        grad_lse = torch.randn(lse.shape, generator=gen)
        torch.autograd.backward([out, lse], [grad_out, grad_lse])
    else:
        out = fn(q, k, v, **call)
        grad_out = torch.randn(out.shape, generator=gen)
        out.backward(grad_out)
    got = {"q": q.grad, "k": k.grad, "v": v.grad}
    if bias is not None and case.bias_grad:
        got["bias"] = bias.grad
    reference = reference_gradients(ir, q, k, v, grad_out, grad_lse=grad_lse, **call)
    if reference["v"].norm().item() == 0.0:
        # No key is kept anywhere (an empty layout): every gradient is exactly 0.
        for name, grad in got.items():
            assert grad is not None and not grad.abs().max().item(), f"d{name} should be 0"
        return
    # dq and dk can be 0 analytically: a softmax row keeping one key (Nk = 1, a window of 1)
    # has p = 1 whatever its score, and dS = p (dP - delta) cancels exactly. The kernels then
    # return fp32 rounding noise of that cancellation, |dS| ~ eps |do_i| |v_j|, which the
    # relative measure (against 1e-3 |dv|) cannot judge. Such a gradient must be within
    # that noise instead: eps-level, 8 eps scale max|q|,|k| max|v| |do|.
    scale = case.program.scale if case.program.scale is not None else case.d ** -0.5
    qk_max = max(q.detach().double().norm(dim=-1).max().item(), k.detach().double().norm(dim=-1).max().item())
    noise = (8 * torch.finfo(torch.float32).eps * scale * qk_max
             * v.detach().double().norm(dim=-1).max().item() * grad_out.double().norm().item())
    for name in ("q", "k"):
        if reference[name].norm().item() <= 1e-3 * noise:
            grad = got.pop(name)
            assert grad.double().norm().item() <= noise, (
                f"d{name} is 0 analytically, got norm {grad.double().norm().item():.3e} "
                f"> rounding bound {noise:.3e}"
            )
    errors = gradient_errors(got, reference)
    for name, err in errors.items():
        assert err <= GRAD_TOLERANCE, f"d{name}: relative error {err:.2e} ({errors})"


def run_case(case: Case) -> None:
    program = case.program
    ir = program.ir()
    note(ir)
    note(f"B={case.b} Hq={case.hq} Hkv={case.hkv} Nq={case.nq} Nk={case.nk} D={case.d} "
         f"{case.dtype} q_scale={case.q_scale} seed={case.seed} bias_shape={case.bias_shape}")
    q, k, v, bias, layout = inputs_of(case)
    call = {"bias": bias, "block_layout": layout, "doc_ids": doc_ids_of(case)}
    fn = af.compile(ir)
    softmax = program.normalizer == "softmax"
    result = fn(q, k, v, return_lse=softmax, **call)
    expected = af.reference_attention(ir, q, k, v, return_lse=softmax, **call)
    if softmax:
        (out, lse), (ref, ref_lse) = result, expected
        assert_close_to_reference(out, ref, case.dtype)
        assert_lse_close(lse, ref_lse, lse_atol(case, q, k))
    else:
        assert_close_to_reference(result, expected, case.dtype)
    check_tile_ir(case, fn, q, k, v)
    if case.backward:
        check_gradients(case, fn, ir, q, k, v, bias, layout)


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------

ALIBI = ScoreOp("alibi")
CAUSAL = ScoreOp("mask", "[#attn.causal]")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
# Two ALiBis on the path, one with the default slopes and one with explicit ones: applied twice.
@example(case=Case(Program(chain=(ALIBI, ScoreOp("alibi", (0.5, -0.25)), CAUSAL)), nq=30, nk=40,
                   backward=True))
# An unused ALiBi alone: no slopes, no tile.alibi in any kernel.
@example(case=Case(Program(dead=((0, (ALIBI,)),)), nq=20, nk=33, backward=True))
# Unused ALiBis off the scores and stacked on a dead soft-cap, beside a live soft-cap.
@example(case=Case(Program(chain=(ScoreOp("softcap", 2.0),),
                           dead=((0, (ALIBI,)), (1, (ScoreOp("softcap", 1.0), ALIBI)))),
                   hq=4, hkv=2, nq=33, nk=20, backward=True))
# A soft-cap after ALiBi (the DSL never produces this order): capped where the IR says.
@example(case=Case(Program(rope=(None, False), chain=(ALIBI, ScoreOp("softcap", 1.0), CAUSAL)),
                   nq=37, nk=45, q_scale=3.0, backward=True))
# A mask before a soft-cap: the dropped keys stay dropped after the cap (cap(-inf) is finite).
@example(case=Case(Program(chain=(ScoreOp("mask", "[#attn.window<5>]"), ScoreOp("softcap", 0.5)),
                           dead=((1, (ScoreOp("softcap", 3.0),)),)),
                   nq=40, nk=40, q_scale=3.0, backward=True))
@example(case=Case(Program(chain=(CAUSAL, ScoreOp("softcap", 0.5), ScoreOp("add_bias"))),
                   nq=17, nk=9, bias_shape=(2, 1, 9), backward=True, bias_grad=True, lse_grad=True))
# Sigmoid attention with a block-sparse layout (empty rows output 0).
@example(case=Case(Program(chain=(ScoreOp("block_sparse", 16), ScoreOp("alibi")), normalizer="sigmoid"),
                   b=2, nq=40, nk=33, layout_density=0.5, backward=True))
@example(case=Case(Program(chain=(ScoreOp("block_sparse", 16),), normalizer="sigmoid", sigmoid_bias=-1.0),
                   hq=2, hkv=1, nq=20, nk=48, dtype=torch.bfloat16, layout_per_head=True))
# Documents with a block-sparse layout and causal, backward (both filters hold), per sequence ids.
@example(case=Case(Program(chain=(ScoreOp("document"), ScoreOp("block_sparse", 16), CAUSAL)),
                   b=2, nq=40, nk=40, seed=1, backward=True))
# Documents with fewer keys than queries: queries before the first key have no document.
@example(case=Case(Program(chain=(ScoreOp("add_bias"), ScoreOp("document")), normalizer="relu"),
                   nq=30, nk=21, seed=2, backward=True, bias_grad=True))
def test_compiled_program_matches_interpreter(case: Case) -> None:
    run_case(case)


# --------------------------------------------------------------------------------------------
# Dead ops that read call-time data
# --------------------------------------------------------------------------------------------

DEAD_DATA_PROGRAMS = {
    # The only add_bias is dead: the variant declares %bias, nothing on the path reads it.
    "dead_add_bias": (", %bias : !attn.bias", "%dead = attn.add_bias %s, %bias", "bias"),
    # The only block_sparse is dead.
    "dead_block_sparse": (", %layout : !attn.layout",
                          "%dead = attn.block_sparse %s, %layout {block_size = 16 : i64}", "block_layout"),
    # The only document filter is dead.
    "dead_document": (", %doc_ids : !attn.doc_ids", "%dead = attn.document %s, %doc_ids", "doc_ids"),
    # A dead ALiBi with slopes for 3 heads, called with 2.
    "dead_alibi_wrong_heads": ("", "%dead = attn.alibi %s {slopes = [1.0 : f64, 2.0 : f64, 3.0 : f64]}", None),
}


@pytest.mark.parametrize("name", sorted(DEAD_DATA_PROGRAMS))
def test_dead_op_alone_reads_call_time_data(name):
    """A program whose only reader of some call-time data is dead: the kernels ignore the
    op, so must the interpreter; some call (with or without the data) must work for both and
    agree."""
    argument, line, keyword = DEAD_DATA_PROGRAMS[name]
    ir = (f"attn.variant @dead(%q : !attn.query, %k : !attn.key, %v : !attn.value{argument}) -> !attn.output {{\n"
          f"  %s = attn.scores %q, %k\n  {line}\n  %p = attn.softmax %s\n  %o = attn.pv %p, %v\n"
          f"  attn.yield %o\n}}\n")
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, seed=5)
    data = {"bias": torch.randn(1, 2, 20, 30), "block_layout": torch.ones(2, 2, dtype=torch.bool),
            "doc_ids": torch.arange(30) // 7}
    fn = af.compile(ir)
    calls = [{}] if keyword is None else [{}, {keyword: data[keyword]}]
    outcomes = []
    for call in calls:
        try:
            out, ref = fn(q, k, v, **call), af.reference_attention(ir, q, k, v, **call)
        except af.AttnFuseError as err:
            outcomes.append(f"{sorted(call)}: {type(err).__name__}: {err}")
            continue
        assert_close_to_reference(out, ref, q.dtype)
        return
    pytest.fail("no call runs on both the kernels and the interpreter:\n" + "\n".join(outcomes))


def test_mask_before_softcap_keeps_dropped_keys_dropped():
    """`cap * tanh(-inf / cap)` is `-cap`, a finite score: a mask applied before a soft-cap
    must still drop its keys, in the kernels and in the interpreter alike (checked against
    attention written out by hand, and against the weight such keys would otherwise get)."""
    program = Program(chain=(ScoreOp("mask", "[#attn.window<3>]"), ScoreOp("softcap", 0.5)))
    ir = program.ir()
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16, seed=9)
    q = q * 3
    out = af.compile(ir)(q, k, v)
    ref = af.reference_attention(ir, q, k, v)
    assert_close_to_reference(out, ref, q.dtype)
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(16)
    s = 0.5 * torch.tanh(s / 0.5)
    offset = torch.arange(24)[None, :] - torch.arange(24)[:, None]
    dropped = offset.abs() >= 3
    expected = torch.softmax(s.masked_fill(dropped, float("-inf")), -1) @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    undropped = torch.softmax(s.masked_fill(dropped, -0.5), -1) @ v.double()
    assert (undropped - expected).abs().max() > 0.1, "the test cannot tell the two apart"
