"""Hand-written attn programs through `af.compile` and `af.reference_attention`: they run, are
checked, share kernels with the DSL variants they equal, and bad ones fail clearly."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference, make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime import compiler
from attnfuse.runtime.program import parse_attn

pytestmark = pytest.mark.interpreter

CAUSAL_ALIBI = """
attn.variant @causal_alibi(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %a = attn.alibi %m
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
"""


def variant(body: str, args: str = "") -> str:
    """An attn.variant around `body` (ops from %s to the normalizer's result %p)."""
    return (f"attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value{args}) -> !attn.output {{\n"
            f"  %s = attn.scores %q, %k\n{body}\n  %o = attn.pv %p, %v\n  attn.yield %o\n}}")


@pytest.mark.parametrize("as_module", [False, True])
def test_ir_runs_and_matches_the_dsl_variant(as_module):
    q, k, v = make_qkv(1, 4, 2, 29, 33, 16, seed=1)
    source = parse_attn(CAUSAL_ALIBI) if as_module else CAUSAL_ALIBI
    out, lse = af.compile(source)(q, k, v, return_lse=True)
    spec = af.attention(af.alibi(), af.causal())
    ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
    assert_close_to_reference(out, ref, q.dtype)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=0)
    torch.testing.assert_close(af.reference_attention(source, q, k, v), ref, atol=1e-12, rtol=0)


def test_equal_programs_share_one_cache_entry():
    """The compile cache keys on the canonical program: the IR above (mask first) and the DSL
    variant (written alibi-first) are the same program."""
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16)
    spec = af.attention(af.causal(), af.alibi())
    fn = af.compile(spec)
    key = fn.compile_key(fn.plan(q, k, v).problem)
    assert compiler._cache_key(CAUSAL_ALIBI, key, True) == compiler._cache_key(spec, key, True)


def test_double_alibi_applies_twice():
    ir = variant("  %a = attn.alibi %s\n  %b = attn.alibi %a\n  %p = attn.softmax %b")
    q, k, v = make_qkv(1, 4, 4, 24, 24, 16, seed=2)
    out = af.compile(ir)(q, k, v)
    twice = af.attention(af.alibi([2 * x for x in (0.25, 0.0625, 0.015625, 0.00390625)]))
    assert_close_to_reference(out, af.reference_attention(twice, q, k, v), q.dtype)


def test_an_unused_op_reads_nothing():
    ir = variant("  %a = attn.add_bias %s, %bias\n  %p = attn.softmax %s", ", %bias : !attn.bias")
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16)
    out = af.compile(ir)(q, k, v)  # no bias= needed: nothing reads it
    assert_close_to_reference(out, af.reference_attention(af.attention(), q, k, v), q.dtype)


@pytest.mark.parametrize(
    "source, error",
    [
        ("attn.variant @x(", "cannot parse the attn program: <attn program>:1"),
        (variant("  %p = attn.softmax %s\n  %r = attn.relu %s"), "exactly one normalizer"),
        (variant("  %a = attn.block_sparse %s, %layout {block_size = 16 : i64}\n"
                 "  %b = attn.block_sparse %a, %layout {block_size = 32 : i64}\n  %p = attn.softmax %b",
                 ", %layout : !attn.layout"), "more than one block_sparse"),
        (CAUSAL_ALIBI + CAUSAL_ALIBI.replace("@causal_alibi", "@again"), "holds one attn.variant at its top level, got 2"),
        (42, "compile\\(\\) takes a spec made by af.attention"),
        # Unhashable objects get the same refusal (not the compile cache's TypeError).
        ([CAUSAL_ALIBI], "compile\\(\\) takes a spec made by af.attention"),
        ({"ir": CAUSAL_ALIBI}, "compile\\(\\) takes a spec made by af.attention"),
        # A property of the wrong type fails while its op is parsed: located at that op.
        (variant("  %c = attn.softcap %s {cap = 3}\n  %p = attn.softmax %c"),
         "<attn program>:3:3\n(.|\n)*attn.softcap: property 'cap' must be a float attribute, got 3 : i64"),
        # In the generic form it fails when the program is verified: located and named too.
        (variant('  %c = "attn.softcap"(%s) <{cap = "big"}> : (!attn.scores) -> !attn.scores\n'
                 "  %p = attn.softmax %c"),
         "not valid: <attn program>:3:3: attn.softcap: property 'cap' must be a float attribute, got \"big\""),
        # Any verifier's error is located at its op.
        (variant("  %c = attn.softcap %s {cap = -1.0 : f64}\n  %p = attn.softmax %c"),
         "not valid: <attn program>:3:3: attn.softcap: "),
    ],
)
def test_bad_programs(source, error):
    """Refused where the program is compiled (docs/robustness.md), not at its first call."""
    with pytest.raises(af.AttnFuseError, match=error):
        af.compile(source)


def test_call_time_data_the_program_declares():
    ir = variant("  %a = attn.add_bias %s, %bias\n  %p = attn.softmax %a", ", %bias : !attn.bias")
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16)
    with pytest.raises(ArgumentError, match="needs bias= at call time"):
        af.compile(ir)(q, k, v)
    with pytest.raises(ArgumentError, match="block_layout= given, but"):
        af.compile(ir)(q, k, v, bias=torch.zeros(16), block_layout=torch.ones(1, 1, dtype=torch.bool))


def test_a_dead_rotation_rotates_nothing():
    """Lowered without canonicalize-attn too: only rotations the scores read count."""
    from xdsl.passes import PassPipeline

    from attnfuse.dialects import make_context, tile
    from attnfuse.transforms import PASSES

    ir = ("attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {\n"
          "  %qr = attn.rope %q {theta = 1.0e+04 : f64} : !attn.query\n"
          "  %kr = attn.rope %k {theta = 1.0e+04 : f64} : !attn.key\n"
          "  %s = attn.scores %q, %k\n  %p = attn.softmax %s\n  %o = attn.pv %p, %v\n  attn.yield %o\n}")
    module = parse_attn(ir)
    PassPipeline.parse_spec(PASSES, "place-rope,lower-to-tile{backward=false}").apply(make_context(), module)
    assert not [op for op in module.walk() if isinstance(op, tile.RotateOp)]
    assert [op.sym_name.data for op in module.ops] == ["attention_fwd"]


def test_declared_positions_a_dead_rotation_would_read():
    ir = ("attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>) -> !attn.output {\n"
          "  %qr = attn.rope %q at %qp {theta = 1.0e+04 : f64} : !attn.query, !attn.positions<query>\n"
          "  %s = attn.scores %q, %k\n  %p = attn.softmax %s\n  %o = attn.pv %p, %v\n  attn.yield %o\n}")
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16)
    fn = af.compile(ir)
    plain = af.reference_attention(af.attention(), q, k, v)
    assert_close_to_reference(fn(q, k, v), plain, q.dtype)
    assert_close_to_reference(fn(q, k, v, q_positions=torch.arange(16)), plain, q.dtype)
    with pytest.raises(ArgumentError, match="k_positions= given"):
        fn(q, k, v, k_positions=torch.arange(16))


@pytest.mark.parametrize(
    "source, error",
    [
        ("attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {\n"
         "  %s = attn.scores %q, %k\n  %c = attn.softcap %s {cap = 1.0e+39 : f64}\n"
         "  %p = attn.softmax %c\n  %o = attn.pv %p, %v\n  attn.yield %o\n}", "softcap cap must lie in"),
        ("attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {\n"
         "  %s = attn.scores %q, %k\n  %p = attn.sigmoid %s {bias = 0x7FF0000000000000 : f64}\n"
         "  %o = attn.pv %p, %v\n  attn.yield %o\n}", "sigmoid bias must be a finite fp32 number"),
        ("attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {\n"
         "  %s = attn.scores %q, %k\n  %a = attn.alibi %s {slopes = [0x7FF8000000000000 : f64, 1.0 : f64]}\n"
         "  %p = attn.softmax %a\n  %o = attn.pv %p, %v\n  attn.yield %o\n}", "alibi slopes must be finite"),
        ("builtin.module {\n}", "holds one attn.variant at its top level, got 0"),
    ],
)
def test_parameters_out_of_fp32_range_and_empty_modules(source, error):
    """Rejected by af.compile and by the reference alike (it interprets valid programs only)."""
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16)
    with pytest.raises(af.AttnFuseError, match=error):
        af.compile(source)
    with pytest.raises(af.AttnFuseError, match=error):
        af.reference_attention(source, q, k, v)
