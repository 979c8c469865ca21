"""Traits the tile dialect's verifiers look for, so that an op's verifier asks what kind of op
encloses or reads it without importing every op class (MLIR's op traits)."""

from __future__ import annotations

from xdsl.traits import OpTrait


class BlockLoop(OpTrait):
    """A loop over key or query blocks (`tile.kv_loop`, `tile.sparse_kv_loop`, `tile.q_loop`,
    `tile.sparse_q_loop`): the ops of its body run once per block, on that block's rows."""


class ExponentiatesScores(OpTrait):
    """The op exponentiates a block of scores, its `scores` operand (`tile.softmax_update`,
    `tile.recompute_probs`), so a scale on those scores can be applied in the same multiply:
    `fold-scale-into-exp` folds a `tile.scores` scale into the ops with this trait, and the
    `tile.scores` verifier lets `unscaled` scores reach only them."""
