"""The fused backward kernel's shape (dialects/backward_shape.py): the parts a warp-specialized
backward schedules by, read off the kernels `lower-to-tile{bwd-dq=fused}` builds."""

from __future__ import annotations

import dataclasses

import pytest

import attnfuse as af
from attnfuse.dialects import tile
from attnfuse.dialects.backward_shape import backward_kernel
from attnfuse.dialects.flash_shape import NotFlashShaped
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig


def fused_kernel(spec, head_dim=128, dtype="bf16", placement=("pre_rotated", "pre_rotated")):
    key = dataclasses.replace(CompileKey(head_dim, head_dim, dtype, TileConfig(64, 64, 4, 2), placement),
                              bwd_dq="fused")
    module = lower_spec(spec, key)
    return next(op for op in module.ops if op.sym_name.data == "attention_bwd_dkdv_dq")


@pytest.mark.parametrize("spec, loops, masked", [
    (af.attention(), 2, [False, True]),  # the ragged tail block masked
    (af.attention(af.causal()), 3, [True, False, True]),
    (af.attention(af.rope(), af.causal()), 3, [True, False, True]),
    (af.attention(af.alibi(), af.causal()), 3, [True, False, True]),
    (af.attention(af.sliding_window(128)), 3, [True, False, True]),
    (af.attention(af.softcap(30.0)), 2, [False, True]),
])
def test_lowered_fused_kernels_have_the_shape(spec, loops, masked):
    parts = backward_kernel(fused_kernel(spec))
    assert len(parts.loops) == loops
    assert [loop.masked for loop in parts.loops] == masked
    for loop in parts.loops:
        assert loop.store_add.role == "dq_acc"
        assert loop.dq_part.rhs is parts.k_load.result
        assert loop.dk_accumulate.probs is (loop.vjp_ops[-1].result if loop.vjp_ops else loop.grad_scores.result)
    assert parts.operands[1] in ("k", "k_rot") and parts.operands[3] == "do"


def test_causal_masks_sit_only_on_the_partial_blocks():
    parts = backward_kernel(fused_kernel(af.attention(af.causal())))
    assert [o.name for o in parts.epilogue] == ["tile.apply_scale", "tile.store", "tile.store"]
    assert [[op.name for op in loop.score_ops] for loop in parts.loops] == [["tile.mask"], [], ["tile.mask"]]


def test_the_wrong_kernel_and_head_dim_are_refused():
    with pytest.raises(NotFlashShaped, match="head dim 32"):
        backward_kernel(fused_kernel(af.attention(), head_dim=32))
    key = CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), ("pre_rotated", "pre_rotated"))
    separate = next(op for op in lower_spec(af.attention(), key).ops if op.sym_name.data == "attention_bwd_dkdv")
    with pytest.raises(NotFlashShaped, match="only the fused backward kernel"):
        backward_kernel(separate)


def test_a_reordered_yield_names_the_op():
    kernel = fused_kernel(af.attention())
    loop = next(op for op in kernel.body.block.ops if isinstance(op, tile.QLoopOp))
    end = loop.body.block.last_op
    dk, dv = end.operands
    end.operands = [dv, dk]
    with pytest.raises(NotFlashShaped, match=r"attention_bwd_dkdv_dq \(tile.yield\): the loop carries dK then dV"):
        backward_kernel(kernel)


def test_softcap_vjp_is_a_vjp_op():
    parts = backward_kernel(fused_kernel(af.attention(af.softcap(30.0))))
    loop = parts.loops[0]
    assert [op.name for op in loop.score_ops] == ["tile.map"] and [op.name for op in loop.vjp_ops] == ["tile.map"]
    assert loop.vjp_ops[0].inputs[0] is loop.scores.result


def test_loops_that_add_differently_are_refused():
    """Hand-written IR whose query loops add their dQ parts differently (one in key-block
    order, one not) has no schedule: the one dQ writer would print them alike."""
    key = dataclasses.replace(CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), None), bwd_dq="ordered")
    kernel = next(op for op in lower_spec(af.attention(af.causal()), key).ops
                  if op.sym_name.data == "attention_bwd_dkdv_dq")
    assert all(loop.store_add.ordered for loop in backward_kernel(kernel).loops)
    ordered_add = next(op for op in kernel.walk() if isinstance(op, tile.StoreAddOp))
    unordered = tile.StoreAddOp(ordered_add.value, ordered_add.dest, "loop", "all")
    ordered_add.parent_block().insert_op_before(unordered, ordered_add)
    ordered_add.detach()
    ordered_add.erase()
    with pytest.raises(NotFlashShaped, match="added alike"):
        backward_kernel(kernel)
