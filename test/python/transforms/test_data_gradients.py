"""Where the backward stores the gradients of call-time data (`kernel_builder.lower_chain_vjp`):
summed per role, stored once the last op declaring the role has given its contributions, before
the VJPs further down the chain (so a schedule that refines one gradient tile in place stores
the tile as it is there), whatever number of contributions each op gives."""

from __future__ import annotations

import attnfuse as af
from attnfuse.blocks.additive_bias import AddBiasSemantics
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig


def dq_bias_kernel(spec, bwd_dq="separate"):
    key = CompileKey(32, 32, "f32", TileConfig(32, 32, 4, 1), None, bwd_dq=bwd_dq)
    name = "attention_bwd_dq_bias" if bwd_dq == "separate" else "attention_bwd_dkdv_dq_bias"
    return next(op for op in lower_spec(spec, key).ops if op.sym_name.data == name)


def loop_ops(kernel):
    loop = next(op for op in kernel.body.block.ops if op.regions and op.body.block.ops)
    return list(loop.body.block.ops)


def test_the_gradient_is_stored_before_the_vjps_below_it():
    """Soft-capping before the bias: the bias gradient is dS at the bias, stored before the
    soft-cap's VJP (a map) refines the tile further."""
    for bwd_dq in ("separate", "fused"):
        ops = loop_ops(dq_bias_kernel(af.attention(af.softcap(30.0), af.additive_bias()), bwd_dq))
        names = [op.name for op in ops]
        store = names.index("tile.store_scores")
        assert names.index("tile.softmax_grad") < store < names.index("tile.map", store), names
        assert ops[store].value is ops[names.index("tile.softmax_grad")].result


def test_every_contribution_of_an_op_is_summed(monkeypatch):
    """An op whose `data_gradient` gives two contributions to its role (the interface sums
    them per role): both are summed into the one store, none dropped."""
    monkeypatch.setattr(AddBiasSemantics, "data_gradient",
                        lambda self, op, kernel, grad: [("dbias", grad), ("dbias", grad)])
    ops = loop_ops(dq_bias_kernel(af.attention(af.additive_bias())))
    stores = [op for op in ops if op.name == "tile.store_scores"]
    assert len(stores) == 1
    total = stores[0].value.owner
    assert total.name == "tile.map" and len(total.inputs) == 2, total
