"""What the pointwise normalizers (relu, sigmoid) share: probabilities that are a function of
each score alone, so the forward needs no running statistics. Not a block (the leading `_`
keeps `block_modules` from listing it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import f32
from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.dialects.interfaces import Normalizer


@dataclass(frozen=True)
class PointwiseNormalizer(Normalizer):
    """A normalizer whose probabilities are a function of each score alone (dropped keys give
    0): the forward accumulates `p @ v` with no rescaling, the output is the accumulator."""

    merges_splits: bool = True  # the output is a sum over keys, so the splits' partials add

    def state_names(self, op: Operation) -> tuple[str, ...]:
        return ("acc",)

    def init_state(self, op: Operation, kernel: Any) -> Sequence[SSAValue]:
        return kernel.add(tile.ZerosOp(tile.TileType(("m", "dv"), f32)), "acc").results

    def step(self, op: Operation, kernel: Any, state: Sequence[SSAValue], scores: SSAValue,
             value: SSAValue) -> Sequence[SSAValue]:
        probs = self.probs(op, kernel, scores, None)
        return [kernel.add(tile.AccumulateOp(state[0], probs, value), "acc").results[0]]

    def finalize(self, op: Operation, kernel: Any,
                 state: Sequence[SSAValue]) -> tuple[SSAValue, SSAValue | None]:
        # The weights are already normalized: the accumulator is the output.
        return state[0], None
