"""The tile verifier keeps `fold-scale-into-exp`'s contract: unscaled scores reach only
exponentials that apply the same scale."""

from __future__ import annotations

import pytest
from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import VerifyException

import attnfuse as af
from attnfuse.dialects import make_context, tile
from attnfuse.transforms import DEFAULT_PIPELINE, PASSES


def folded_module():
    module = af.attention(af.causal()).module()
    PassPipeline.parse_spec(PASSES, DEFAULT_PIPELINE).apply(make_context(), module)
    module.verify()
    return module


def test_the_default_pipeline_folds_the_causal_softmax():
    module = folded_module()
    scores = [op for op in module.walk() if isinstance(op, tile.ScoresOp)]
    assert scores and all(op.unscaled is not None for op in scores)


def test_an_exponential_that_forgets_the_scale_is_rejected():
    module = folded_module()
    update = next(op for op in module.walk() if isinstance(op, tile.SoftmaxUpdateOp))
    del update.properties["unscaled_scores"]
    with pytest.raises(VerifyException, match="unscaled scores must reach only exponentials"):
        module.verify()


def test_a_different_static_scale_is_rejected():
    module = folded_module()
    update = next(op for op in module.walk() if isinstance(op, tile.SoftmaxUpdateOp))
    from xdsl.dialects.builtin import FloatAttr, f64

    update.properties["scale"] = FloatAttr(0.5, f64)
    with pytest.raises(VerifyException, match="the same scale"):
        module.verify()
