"""The blocks added after rope/causal/sliding_window: alibi, additive_bias, block_sparse, relu
and Llama-3.1 RoPE scaling, at the DSL level (no kernels run here).

Parameter validation, composition rules, identity (order-independent equality and hash) and
the attn IR they produce: it parses back, verifies and canonicalizes to one form whatever the
order the blocks were written in.
"""

from __future__ import annotations

import itertools

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.passes import PassPipeline

import attnfuse as af
from attnfuse.dialects import make_context
from attnfuse.errors import CompositionError
from attnfuse.transforms import DEFAULT_PIPELINE, PASSES


def parse(text: str) -> ModuleOp:
    module = Parser(make_context(), text).parse_module()
    module.verify()
    return module


def run_pipeline(module: ModuleOp, pipeline: str) -> ModuleOp:
    PassPipeline.parse_spec(PASSES, pipeline).apply(make_context(), module)
    module.verify()
    return module


def canonical_ir(spec) -> str:
    """The spec's IR, printed, parsed back and run through canonicalize-attn."""
    return str(run_pipeline(parse(spec.ir()), "canonicalize-attn"))


# --------------------------------------------------------------------------------------------
# Parameter validation: a bad parameter fails where it is written, naming the block
# --------------------------------------------------------------------------------------------

BAD_PARAMETERS = {
    "block_sparse-24": (lambda: af.block_sparse(24), "block_sparse"),
    "block_sparse-8": (lambda: af.block_sparse(8), "block_sparse"),
    "block_sparse-0": (lambda: af.block_sparse(0), "block_sparse"),
    "block_sparse-negative": (lambda: af.block_sparse(-32), "block_sparse"),
    "block_sparse-bool": (lambda: af.block_sparse(True), "block_sparse"),
    "block_sparse-float": (lambda: af.block_sparse(32.0), "block_sparse"),
    "block_sparse-str": (lambda: af.block_sparse("32"), "block_sparse"),
    "alibi-empty": (lambda: af.alibi([]), "alibi"),
    "alibi-str-item": (lambda: af.alibi(["x"]), "alibi"),
    "alibi-nan": (lambda: af.alibi([float("nan")]), "alibi"),
    "alibi-inf": (lambda: af.alibi([0.5, float("inf")]), "alibi"),
    "alibi-not-sequence": (lambda: af.alibi(3), "alibi"),
    "alibi-none-item": (lambda: af.alibi([0.5, None]), "alibi"),
    "llama3-factor-0": (lambda: af.llama3_scaling(factor=0), "llama3_scaling"),
    "llama3-factor-negative": (lambda: af.llama3_scaling(factor=-2.0), "llama3_scaling"),
    "llama3-low-0": (lambda: af.llama3_scaling(low_freq_factor=0), "llama3_scaling"),
    "llama3-max-pos-0": (lambda: af.llama3_scaling(original_max_position=0), "llama3_scaling"),
    "llama3-max-pos-bool": (lambda: af.llama3_scaling(original_max_position=True), "llama3_scaling"),
    "llama3-factor-str": (lambda: af.llama3_scaling(factor="8"), "llama3_scaling"),
    "llama3-high-below-low": (
        lambda: af.llama3_scaling(high_freq_factor=1, low_freq_factor=2),
        "llama3_scaling",
    ),
    "llama3-high-equals-low": (
        lambda: af.llama3_scaling(high_freq_factor=2, low_freq_factor=2),
        "llama3_scaling",
    ),
    "rope-scaling-str": (lambda: af.rope(scaling="x"), "rope"),
    "rope-scaling-dict": (lambda: af.rope(scaling={"factor": 8.0}), "rope"),
}


@pytest.mark.parametrize("name", list(BAD_PARAMETERS))
def test_bad_parameter_raises_naming_the_block(name):
    make, block_name = BAD_PARAMETERS[name]
    with pytest.raises(af.AttnFuseError) as info:
        make()
    assert isinstance(info.value, CompositionError)
    assert block_name in str(info.value)


def test_good_parameters():
    for bs in (16, 32, 64, 128, 256):
        assert af.block_sparse(bs).block_size == bs
    # Slopes are normalized to a tuple of floats: hashable, equal whatever sequence was given.
    assert af.alibi([1, 0.5]) == af.alibi((1.0, 0.5))
    assert hash(af.alibi([1, 0.5])) == hash(af.alibi((1.0, 0.5)))
    assert af.alibi([1, 0.5]).slopes == (1.0, 0.5)
    assert af.alibi() != af.alibi([0.5])
    assert af.alibi([-0.25, 0.0]).slopes == (-0.25, 0.0)  # any finite slope is a valid slope
    scaling = af.llama3_scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)
    assert scaling == af.llama3_scaling()
    assert af.rope(theta=500000.0, scaling=scaling) == af.rope(theta=500000.0, scaling=af.llama3_scaling())
    assert af.rope(scaling=scaling) != af.rope()
    assert af.rope(scaling=scaling) != af.rope(scaling=af.llama3_scaling(original_max_position=64))
    assert hash(af.rope(scaling=scaling)) == hash(af.rope(scaling=af.llama3_scaling()))
    assert af.relu() == af.relu() and af.additive_bias() == af.additive_bias()
    assert af.block_sparse(32) != af.block_sparse(64)


def test_blocks_are_frozen():
    with pytest.raises(AttributeError):
        af.block_sparse(32).block_size = 64  # type: ignore[misc]
    with pytest.raises(AttributeError):
        af.alibi([0.5]).slopes = (1.0,)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        af.llama3_scaling().factor = 2.0  # type: ignore[misc]


def test_reprs_name_the_blocks():
    spec = af.attention(
        af.alibi([0.5]), af.additive_bias(), af.block_sparse(32), af.relu(),
        af.rope(scaling=af.llama3_scaling(original_max_position=64)),
    )
    text = repr(spec)
    for name in ("alibi", "additive_bias", "block_sparse", "relu", "rope", "llama3_scaling", "64", "32"):
        assert name in text, text


# --------------------------------------------------------------------------------------------
# Composition: illegal ones raise, naming the blocks; legal ones are order-independent
# --------------------------------------------------------------------------------------------

ILLEGAL = {
    "relu+softmax": ([af.relu(), af.softmax()], ["relu", "softmax"]),
    "softmax+relu": ([af.softmax(), af.relu()], ["relu", "softmax"]),
    "two-relu": ([af.relu(), af.causal(), af.relu()], ["relu"]),
    "two-alibi": ([af.alibi(), af.alibi([0.5])], ["alibi"]),
    "two-alibi-same": ([af.alibi(), af.causal(), af.alibi()], ["alibi"]),
    "two-additive_bias": ([af.additive_bias(), af.additive_bias()], ["additive_bias"]),
    "two-block_sparse": ([af.block_sparse(16), af.block_sparse(32)], ["block_sparse"]),
    "full+block_sparse": ([af.full(), af.block_sparse(32)], ["full", "block_sparse"]),
    "block_sparse+full": ([af.block_sparse(32), af.relu(), af.full()], ["full", "block_sparse"]),
    "full+causal+block_sparse": ([af.causal(), af.full(), af.block_sparse(64)], ["full"]),
    "two-rope-scaled": (
        [af.rope(scaling=af.llama3_scaling()), af.rope()],
        ["rope"],
    ),
    "not-a-block": ([af.relu(), af.llama3_scaling()], ["block"]),
}


@pytest.mark.parametrize("name", list(ILLEGAL))
def test_illegal_composition_raises(name):
    blocks, words = ILLEGAL[name]
    with pytest.raises(af.AttnFuseError) as info:
        af.attention(*blocks)
    assert isinstance(info.value, CompositionError)
    for word in words:
        assert word in str(info.value), str(info.value)


LEGAL_SETS = {
    "alibi+causal+relu": lambda: [af.alibi(), af.causal(), af.relu()],
    "bias+block_sparse": lambda: [af.additive_bias(), af.block_sparse(32)],
    "all-masks+modifiers": lambda: [
        af.block_sparse(16), af.causal(), af.sliding_window(7), af.alibi([0.5, 0.25]), af.additive_bias(),
    ],
    "scaled-rope+relu+scale": lambda: [
        af.rope(theta=500000.0, scaling=af.llama3_scaling(original_max_position=64)),
        af.relu(),
        af.scaled_dot_product(0.125),
        af.block_sparse(64),
    ],
    "softmax+bias+alibi": lambda: [af.softmax(), af.additive_bias(), af.alibi()],
}


@pytest.mark.parametrize("name", list(LEGAL_SETS))
def test_legal_composition_is_order_independent(name):
    blocks = LEGAL_SETS[name]()
    perms = list(itertools.permutations(blocks))
    specs = [af.attention(*p) for p in perms]
    first = specs[0]
    for spec in specs[1:]:
        assert spec == first
        assert hash(spec) == hash(first)
        assert spec.canonical_blocks == first.canonical_blocks
    assert len(set(specs)) == 1


def test_the_example_from_the_brief():
    a = af.attention(af.alibi(), af.causal(), af.relu())
    b = af.attention(af.relu(), af.causal(), af.alibi())
    assert a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1


@pytest.mark.parametrize(
    "a, b",
    [
        pytest.param(lambda: [af.relu()], lambda: [af.softmax()], id="relu-vs-softmax"),
        pytest.param(lambda: [af.relu()], lambda: [], id="relu-vs-default"),
        pytest.param(lambda: [af.alibi()], lambda: [af.alibi([0.5])], id="alibi-slopes"),
        pytest.param(lambda: [af.alibi([0.5])], lambda: [af.alibi([0.25])], id="alibi-slope-values"),
        pytest.param(lambda: [af.alibi()], lambda: [af.additive_bias()], id="alibi-vs-bias"),
        pytest.param(lambda: [af.block_sparse(16)], lambda: [af.block_sparse(32)], id="block-size"),
        pytest.param(lambda: [af.block_sparse(16)], lambda: [], id="block_sparse-vs-full"),
        pytest.param(
            lambda: [af.rope()],
            lambda: [af.rope(scaling=af.llama3_scaling())],
            id="rope-scaling",
        ),
        pytest.param(
            lambda: [af.rope(scaling=af.llama3_scaling(factor=8.0))],
            lambda: [af.rope(scaling=af.llama3_scaling(factor=4.0))],
            id="rope-scaling-factor",
        ),
    ],
)
def test_different_variants_differ(a, b):
    sa, sb = af.attention(*a()), af.attention(*b())
    assert sa != sb
    assert len({sa, sb}) == 2


def test_explicit_defaults_are_the_defaults():
    # full() is the default mask: the spec (the compile-cache key) is the same without it.
    assert af.attention(af.full(), af.relu()) == af.attention(af.relu())
    assert hash(af.attention(af.full(), af.relu())) == hash(af.attention(af.relu()))
    assert af.attention(af.full(), af.additive_bias(), af.alibi()) == af.attention(af.alibi(), af.additive_bias())
    # An explicit softmax() is the variant without it: the same canonical IR. (The specs
    # themselves compare unequal: only full() is dropped from the spec's key.)
    assert canonical_ir(af.attention(af.softmax(), af.alibi())) == canonical_ir(af.attention(af.alibi()))


# --------------------------------------------------------------------------------------------
# IR: the new blocks print, parse back, verify and canonicalize order-independently
# --------------------------------------------------------------------------------------------

IR_SETS = {
    "bias+block_sparse+causal+alibi": lambda: [
        af.block_sparse(32), af.additive_bias(), af.causal(), af.alibi(),
    ],
    "everything-relu": lambda: [
        af.rope(theta=500000.0, rotary_dim=16, interleaved=True, scaling=af.llama3_scaling(original_max_position=64)),
        af.scaled_dot_product(0.5),
        af.alibi([0.5, 0.25]),
        af.additive_bias(),
        af.sliding_window(5),
        af.block_sparse(64),
        af.relu(),
    ],
}


@pytest.mark.parametrize("name", list(IR_SETS))
def test_ir_round_trips(name):
    spec = af.attention(*IR_SETS[name]())
    text = spec.ir()
    module = parse(text)
    assert str(module) == text  # print -> parse -> print is a fixed point
    for op_name in ("attn.add_bias", "attn.block_sparse"):
        assert op_name in text


def test_ir_carries_the_block_parameters():
    spec = af.attention(*IR_SETS["everything-relu"]())
    text = spec.ir()
    for needle in ("attn.relu", "attn.alibi", "attn.rope", "llama3_scaling", "block_size = 64", "attn.add_bias"):
        assert needle in text, needle
    assert "attn.softmax" not in text
    # The call-time tensors are arguments of the variant.
    assert "!attn.bias" in text and "!attn.layout" in text
    plain = af.attention(af.causal()).ir()
    assert "!attn.bias" not in plain and "!attn.layout" not in plain


@pytest.mark.parametrize("name", list(IR_SETS))
def test_canonicalize_is_order_independent(name):
    blocks = IR_SETS[name]()
    orders = [blocks, blocks[::-1], blocks[1:] + blocks[:1], blocks[2:] + blocks[:2]]
    irs = {canonical_ir(af.attention(*order)) for order in orders}
    assert len(irs) == 1, "\n\n".join(irs)
    # And canonicalize-attn is idempotent.
    (text,) = irs
    assert str(run_pipeline(parse(text), "canonicalize-attn")) == text


def test_canonicalize_differs_for_different_variants():
    a = canonical_ir(af.attention(af.alibi(), af.additive_bias()))
    b = canonical_ir(af.attention(af.alibi(), af.additive_bias(), af.relu()))
    assert a != b


def test_default_pipeline_lowers_new_blocks():
    # block_sparse(64): the pipeline's default tile blocks fit in a layout block.
    spec = af.attention(*IR_SETS["everything-relu"]())
    module = run_pipeline(parse(spec.ir()), DEFAULT_PIPELINE)
    text = str(module)
    assert "attn.variant" not in text  # lowered to tile kernels
    assert "tile." in text


def test_pipeline_with_small_sparse_blocks():
    spec = af.attention(*IR_SETS["bias+block_sparse+causal+alibi"]())  # block_sparse(32)
    pipeline = DEFAULT_PIPELINE.replace("lower-to-tile", "lower-to-tile{block-m=32 block-n=16}")
    text = str(run_pipeline(parse(spec.ir()), pipeline))
    assert "attn.variant" not in text
    # Tiles larger than the layout's blocks are rejected with an error naming block_sparse.
    too_big = DEFAULT_PIPELINE.replace("lower-to-tile", "lower-to-tile{block-m=64 block-n=64}")
    with pytest.raises(af.AttnFuseError, match="block_sparse"):
        run_pipeline(parse(spec.ir()), too_big)
