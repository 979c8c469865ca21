"""The DSL: composing blocks into a spec, its identity, its errors and its IR."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

import attnfuse as af
from attnfuse.dialects import make_context
from attnfuse.errors import AttnFuseError, CompositionError


def parse(text: str) -> ModuleOp:
    module = Parser(make_context(), text).parse_module()
    module.verify()
    return module


# --------------------------------------------------------------------------------------------
# Identity: equality and hash are independent of block order
# --------------------------------------------------------------------------------------------

BLOCK_SETS = {
    "rope+causal": lambda: [af.rope(), af.causal()],
    "rope+causal+window+scale": lambda: [
        af.rope(theta=500000.0, rotary_dim=16, interleaved=True),
        af.causal(),
        af.sliding_window(64),
        af.scaled_dot_product(0.25),
    ],
    "all-softmax": lambda: [af.scaled_dot_product(), af.rope(), af.sliding_window(3), af.softmax()],
    "window+causal": lambda: [af.sliding_window(8), af.causal()],
}


@pytest.mark.parametrize("name", list(BLOCK_SETS))
def test_equality_and_hash_independent_of_order(name):
    blocks = BLOCK_SETS[name]()
    specs = [af.attention(*perm) for perm in itertools.permutations(blocks)]
    first = specs[0]
    for spec in specs[1:]:
        assert spec == first
        assert hash(spec) == hash(first)
    assert len(set(specs)) == 1
    # Usable as a dict key (the compile-cache key).
    table = {first: "x"}
    assert all(table[s] == "x" for s in specs)


def test_blocks_are_values():
    assert af.rope() == af.rope(theta=10000.0, rotary_dim=None, interleaved=False)
    assert hash(af.causal()) == hash(af.causal())
    assert af.sliding_window(4) == af.sliding_window(4)
    assert af.sliding_window(4) != af.sliding_window(5)
    assert af.scaled_dot_product(0.5) == af.scaled_dot_product(0.5)
    # Parameters are frozen.
    with pytest.raises(AttributeError):
        af.rope().theta = 3.0  # type: ignore[misc]


def test_full_is_the_default_mask():
    assert af.attention(af.full()) == af.attention()
    assert hash(af.attention(af.full())) == hash(af.attention())
    assert af.attention(af.full(), af.rope()) == af.attention(af.rope())
    assert af.attention(af.rope(), af.full()) == af.attention(af.rope())


@pytest.mark.parametrize(
    "a, b",
    [
        pytest.param(lambda: af.attention(af.causal()), lambda: af.attention(), id="causal-vs-none"),
        pytest.param(lambda: af.attention(af.rope()), lambda: af.attention(af.rope(theta=500000.0)), id="theta"),
        pytest.param(lambda: af.attention(af.rope()), lambda: af.attention(af.rope(interleaved=True)), id="interleaved"),
        pytest.param(lambda: af.attention(af.rope()), lambda: af.attention(af.rope(rotary_dim=16)), id="rotary-dim"),
        pytest.param(lambda: af.attention(af.sliding_window(4)), lambda: af.attention(af.sliding_window(5)), id="window"),
        pytest.param(
            lambda: af.attention(af.scaled_dot_product(0.5)),
            lambda: af.attention(af.scaled_dot_product(0.25)),
            id="scale",
        ),
        pytest.param(
            lambda: af.attention(af.causal()),
            lambda: af.attention(af.causal(), af.sliding_window(4)),
            id="extra-mask",
        ),
    ],
)
def test_different_specs_differ(a, b):
    assert a() != b()


def test_spec_is_not_equal_to_other_types():
    spec = af.attention(af.causal())
    assert spec != "attention(causal())"
    assert spec != (af.causal(),)


def test_repr():
    assert repr(af.attention()) == "attention()"
    assert repr(af.attention(af.causal())) == "attention(causal())"
    spec = af.attention(
        af.rope(theta=500000.0, rotary_dim=16, interleaved=True),
        af.sliding_window(8),
        af.scaled_dot_product(0.5),
    )
    text = repr(spec)
    assert text.startswith("attention(")
    for part in ("rope(", "theta=500000.0", "rotary_dim=16", "interleaved=True",
                 "sliding_window(window=8)", "scaled_dot_product(scale=0.5)"):
        assert part in text, (part, text)
    # The user's order is kept in the repr.
    assert text.index("rope(") < text.index("sliding_window(") < text.index("scaled_dot_product(")


@pytest.mark.parametrize(
    "block, text",
    [
        (af.rope(), "rope(theta=10000.0)"),
        (af.full(), "full()"),
        (af.causal(), "causal()"),
        (af.softmax(), "softmax()"),
        (af.sliding_window(3), "sliding_window(window=3)"),
        (af.scaled_dot_product(), "scaled_dot_product()"),
        (af.scaled_dot_product(2), "scaled_dot_product(scale=2.0)"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_block_repr(block, text):
    assert repr(block) == text


def test_spec_blocks_and_lookup():
    r = af.rope()
    spec = af.attention(af.causal(), r)
    assert spec.blocks == (af.causal(), r)
    from attnfuse.blocks.masks import Causal, SlidingWindow
    from attnfuse.dsl.blocks import Rope

    assert spec.block(Rope) is r
    assert spec.block(Causal) == af.causal()
    assert spec.block(SlidingWindow) is None


def test_scale_int_is_accepted_as_float():
    assert af.scaled_dot_product(1).scale == 1.0
    assert af.rope(theta=10000).theta == 10000.0


# --------------------------------------------------------------------------------------------
# Errors: each one an AttnFuseError naming the block
# --------------------------------------------------------------------------------------------

COMPOSITION_ERRORS = {
    "repeated-causal": (lambda: af.attention(af.causal(), af.causal()), "causal"),
    "repeated-rope": (lambda: af.attention(af.rope(), af.rope(theta=500000.0)), "rope"),
    "repeated-window": (lambda: af.attention(af.sliding_window(4), af.sliding_window(8)), "sliding_window"),
    "repeated-scale": (
        lambda: af.attention(af.scaled_dot_product(), af.scaled_dot_product(0.5)),
        "scaled_dot_product",
    ),
    "two-softmax": (lambda: af.attention(af.softmax(), af.softmax()), "softmax"),
    "full+causal": (lambda: af.attention(af.full(), af.causal()), "full"),
    "causal+full": (lambda: af.attention(af.causal(), af.full()), "full"),
    "full+window": (lambda: af.attention(af.full(), af.sliding_window(16)), "full"),
    "full+window+causal": (lambda: af.attention(af.sliding_window(16), af.causal(), af.full()), "full"),
    "repeated-full": (lambda: af.attention(af.full(), af.full()), "full"),
}


@pytest.mark.parametrize("name", list(COMPOSITION_ERRORS))
def test_composition_errors(name):
    make, names = COMPOSITION_ERRORS[name]
    with pytest.raises(AttnFuseError, match=names) as info:
        make()
    assert isinstance(info.value, CompositionError)
    assert isinstance(info.value, ValueError)  # AttnFuseError subclasses ValueError


def test_full_with_mask_error_names_the_other_mask():
    with pytest.raises(AttnFuseError, match="causal"):
        af.attention(af.full(), af.causal())
    with pytest.raises(AttnFuseError, match="sliding_window"):
        af.attention(af.sliding_window(3), af.full())


BLOCK_PARAMETER_ERRORS = {
    "rope-theta-1": (lambda: af.rope(theta=1.0), "rope"),
    "rope-theta-0": (lambda: af.rope(theta=0.0), "rope"),
    "rope-theta-neg": (lambda: af.rope(theta=-10000.0), "rope"),
    "rope-theta-inf": (lambda: af.rope(theta=math.inf), "rope"),
    "rope-theta-nan": (lambda: af.rope(theta=math.nan), "rope"),
    "rope-theta-str": (lambda: af.rope(theta="10000"), "rope"),
    "rope-rotary-odd": (lambda: af.rope(rotary_dim=15), "rope"),
    "rope-rotary-zero": (lambda: af.rope(rotary_dim=0), "rope"),
    "rope-rotary-neg": (lambda: af.rope(rotary_dim=-16), "rope"),
    "rope-rotary-bool": (lambda: af.rope(rotary_dim=True), "rope"),
    "rope-rotary-float": (lambda: af.rope(rotary_dim=16.0), "rope"),
    "rope-interleaved-int": (lambda: af.rope(interleaved=1), "rope"),
    "window-0": (lambda: af.sliding_window(0), "sliding_window"),
    "window-neg": (lambda: af.sliding_window(-1), "sliding_window"),
    "window-float": (lambda: af.sliding_window(4.0), "sliding_window"),
    "window-str": (lambda: af.sliding_window("4"), "sliding_window"),
    "window-bool": (lambda: af.sliding_window(True), "sliding_window"),
    "window-none": (lambda: af.sliding_window(None), "sliding_window"),
    "scale-0": (lambda: af.scaled_dot_product(scale=0), "scaled_dot_product"),
    "scale-neg": (lambda: af.scaled_dot_product(scale=-1), "scaled_dot_product"),
    "scale-nan": (lambda: af.scaled_dot_product(scale=math.nan), "scaled_dot_product"),
    "scale-inf": (lambda: af.scaled_dot_product(scale=math.inf), "scaled_dot_product"),
    "scale-subnormal": (lambda: af.scaled_dot_product(scale=1e-40), "scaled_dot_product"),
    "scale-huge": (lambda: af.scaled_dot_product(scale=1e38 * 3), "scaled_dot_product"),
    "scale-str": (lambda: af.scaled_dot_product(scale="0.5"), "scaled_dot_product"),
    # Ints beyond a float's range are not finite numbers (not an OverflowError).
    "scale-int-beyond-float": (lambda: af.scaled_dot_product(scale=10**400), "scaled_dot_product"),
    "rope-theta-int-beyond-float": (lambda: af.rope(theta=10**400), "rope"),
    "softcap-int-beyond-float": (lambda: af.softcap(10**400), "softcap"),
    "alibi-int-beyond-float": (lambda: af.alibi([10**400]), "alibi"),
    "llama3-factor-0": (lambda: af.llama3_scaling(factor=0.0), "llama3_scaling"),
    "llama3-factor-inf": (lambda: af.llama3_scaling(factor=math.inf), "llama3_scaling"),
    "llama3-max-position-int-beyond-float": (
        lambda: af.llama3_scaling(original_max_position=10**400), "llama3_scaling"),
    "llama3-high-not-above-low": (lambda: af.llama3_scaling(low_freq_factor=4.0, high_freq_factor=4.0),
                                  "llama3_scaling"),
    "alibi-slopes-str": (lambda: af.alibi("12"), "alibi"),  # a sequence of characters
    "alibi-slopes-of-str": (lambda: af.alibi(["0.5"]), "alibi"),
    "alibi-slopes-2d": (lambda: af.alibi(torch.tensor([[0.5, 0.25], [1.0, 2.0]])), "alibi"),
    "alibi-slopes-fraction": (lambda: af.alibi([__import__("fractions").Fraction(1, 2)]), "alibi"),
    "block-size-beyond-i64": (lambda: af.block_sparse(2**64), "block_sparse"),
    "rope-rotary-beyond-i64": (lambda: af.rope(rotary_dim=2**64), "rope"),
    # 1e-300 passes "positive" but divides frequencies into fp32 inf: angles of inf, sines of NaN.
    "llama3-factor-tiny": (lambda: af.llama3_scaling(factor=1e-300), "llama3_scaling"),
}


@pytest.mark.parametrize("scaling", [
    (None, 1.0, 4.0, 1e-3),                                      # every frequency divided, 1 / factor the largest
    (None, 1.960842946761806, 1.9608429467618063, 12.320339592780503),  # factors an ulp apart: the blend's
])                                                               # rounding once pushed it past 1 / factor
def test_the_smallest_llama3_factor_keeps_every_angle_finite(scaling):
    """At the least factor `llama3_scaling` takes, every fp32 angle of an int32 position is
    finite, in the kernels' table frequencies and the reference's (the blend, clamped, lies
    between the kept and the divided frequency), and a call gives finite output."""
    from attnfuse.dialects.attn import MIN_LLAMA3_FACTOR
    from attnfuse.runtime.launch import rope_frequency
    from attnfuse.runtime.reference import rope_inverse_frequencies

    params = (MIN_LLAMA3_FACTOR, *scaling[1:])
    block = af.rope(theta=10000.0, scaling=af.llama3_scaling(*params))
    kernels = torch.tensor([rope_frequency(10000.0, 16, t, params) for t in range(8)]).float()
    reference = rope_inverse_frequencies(10000.0, 16, block.scaling).float()
    for freqs in (kernels, reference):
        assert (freqs <= max(1.0, 1 / MIN_LLAMA3_FACTOR)).all()
        assert torch.isfinite(torch.tensor(2.0**31 - 1, dtype=torch.float32) * freqs).all()
    spec = af.attention(block)
    q = torch.randn(1, 1, 2, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([2**16 - 1, -(2**16)])  # (the table grows to the largest: kept small)
    out = spec(q, q, q, q_positions=positions, k_positions=positions)
    assert torch.isfinite(out).all()
    ref = af.reference_attention(spec, q.double(), q.double(), q.double(), q_positions=positions, k_positions=positions)
    assert torch.isfinite(ref).all()


@pytest.mark.parametrize("name", list(BLOCK_PARAMETER_ERRORS))
def test_block_parameter_errors(name):
    make, block_name = BLOCK_PARAMETER_ERRORS[name]
    with pytest.raises(AttnFuseError, match=block_name) as info:
        make()
    assert isinstance(info.value, CompositionError)


@pytest.mark.parametrize(
    "arg",
    [
        pytest.param("causal", id="str"),
        pytest.param(None, id="none"),
        pytest.param(af.causal, id="uncalled-block-function"),
        pytest.param(42, id="int"),
        pytest.param((af.causal(),), id="tuple-of-blocks"),
        pytest.param([af.rope()], id="list-of-blocks"),
    ],
)
def test_non_block_argument(arg):
    with pytest.raises(AttnFuseError, match="attention"):
        af.attention(af.rope(), arg)


def test_non_block_argument_comes_first():
    with pytest.raises(AttnFuseError):
        af.attention("rope", af.causal())


def test_compile_rejects_non_spec():
    with pytest.raises(AttnFuseError, match="compile"):
        af.compile(af.causal())
    with pytest.raises(AttnFuseError):
        af.compile("attention(causal())")


# --------------------------------------------------------------------------------------------
# IR: spec.ir() is attn-dialect text that parses back and verifies
# --------------------------------------------------------------------------------------------

IR_SPECS = {
    "none": lambda: af.attention(),
    "full": lambda: af.attention(af.full()),
    "causal": lambda: af.attention(af.causal()),
    "window": lambda: af.attention(af.sliding_window(16)),
    "causal+window": lambda: af.attention(af.sliding_window(16), af.causal()),
    "rope": lambda: af.attention(af.rope()),
    "rope-interleaved-partial": lambda: af.attention(af.rope(theta=500000.0, rotary_dim=16, interleaved=True)),
    "scale": lambda: af.attention(af.scaled_dot_product(0.125)),
    "softmax": lambda: af.attention(af.softmax()),
    "everything": lambda: af.attention(
        af.softmax(), af.sliding_window(7), af.causal(), af.scaled_dot_product(0.3),
        af.rope(theta=123456.789, rotary_dim=8, interleaved=True),
    ),
}


@pytest.mark.parametrize("name", list(IR_SPECS))
def test_ir_parses_back_and_verifies(name):
    spec = IR_SPECS[name]()
    text = spec.ir()
    assert "attn.variant" in text
    module = parse(text)
    # Printing the parsed module gives the same text: the round trip is exact.
    assert str(module) == text
    names = [op.name for op in module.walk()]
    assert "attn.scores" in names
    assert "attn.pv" in names


def test_ir_contains_the_blocks():
    spec = IR_SPECS["everything"]()
    text = spec.ir()
    assert text.count("attn.rope") == 2  # q and k
    assert "attn.softmax" in text
    assert "#attn.causal" in text
    assert "#attn.window<7>" in text
    module = parse(text)
    ropes = [op for op in module.walk() if op.name == "attn.rope"]
    assert len(ropes) == 2
    # Static parameters survive the text round trip exactly.
    assert {op.properties["theta"].value.data for op in ropes} == {123456.789}
    (scores,) = [op for op in module.walk() if op.name == "attn.scores"]
    assert scores.properties["scale"].value.data == 0.3


def test_ir_of_equal_specs_parse_to_equivalent_modules():
    a = af.attention(af.rope(), af.causal(), af.sliding_window(8))
    b = af.attention(af.sliding_window(8), af.causal(), af.rope())
    ma, mb = parse(a.ir()), parse(b.ir())
    ops_a = sorted(op.name for op in ma.walk())
    ops_b = sorted(op.name for op in mb.walk())
    assert ops_a == ops_b


def test_module_is_fresh_each_time():
    spec = af.attention(af.causal())
    assert spec.module() is not spec.module()
    spec.module().verify()
