"""Every scalar op the tile dialect admits in a `tile.map` body has a Triton rule: the
verifier's list (`tile.MAP_BODY_OPS`) and the printer's (`SCALAR_RULES`) must not drift apart."""

from __future__ import annotations

import pytest

from attnfuse.dialects import tile
from attnfuse.lowering import triton


@pytest.mark.parametrize("op_type", tile.MAP_BODY_OPS, ids=lambda t: t.name)
def test_every_admitted_op_prints(op_type):
    assert op_type in triton.SCALAR_RULES, f"{op_type.name} passes the verifier but has no Triton rule"


def test_comparisons_agree():
    assert set(triton.COMPARISONS) == set(tile.MAP_COMPARISONS)
