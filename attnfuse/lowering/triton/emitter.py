"""The Triton printer of one `tile.kernel`: `KernelEmitter` joins the op groups' printers and
maps each tile op to its handler (`HANDLERS`)."""

from __future__ import annotations

from attnfuse.dialects import tile
from attnfuse.lowering.triton.backward import BackwardEmitter
from attnfuse.lowering.triton.elementwise import ElementwiseEmitter
from attnfuse.lowering.triton.loops import LoopEmitter
from attnfuse.lowering.triton.memory import MemoryEmitter
from attnfuse.lowering.triton.normalizers import NormalizerEmitter
from attnfuse.lowering.triton.scores import ScoreEmitter
from attnfuse.lowering.triton.splits import SplitEmitter


class KernelEmitter(MemoryEmitter, ScoreEmitter, LoopEmitter, SplitEmitter, NormalizerEmitter,
                    BackwardEmitter, ElementwiseEmitter):
    """Emits one `tile.kernel` as a `@triton.jit` function: the op groups' printers over
    `EmitterCore`. A target for another language subclasses it and overrides handlers."""


KernelEmitter.HANDLERS = {
    tile.LoadOp: KernelEmitter.emit_load,
    tile.StoreOp: KernelEmitter.emit_store,
    tile.StoreAddOp: KernelEmitter.emit_store_add,
    tile.RotateOp: KernelEmitter.emit_rotate,
    tile.ScoresOp: KernelEmitter.emit_scores,
    tile.MaskOp: KernelEmitter.emit_mask,
    tile.KVBoundsOp: KernelEmitter.emit_kv_bounds,
    tile.KVSplitOp: KernelEmitter.emit_kv_split,
    tile.MergeSplitsOp: KernelEmitter.emit_merge_splits,
    tile.MergeLastSplitOp: KernelEmitter.emit_merge_last_split,
    tile.KVLoopOp: KernelEmitter.emit_kv_loop,
    tile.YieldOp: KernelEmitter.emit_yield,
    tile.SoftmaxInitOp: KernelEmitter.emit_softmax_init,
    tile.SoftmaxUpdateOp: KernelEmitter.emit_softmax_update,
    tile.AccumulateOp: KernelEmitter.emit_accumulate,
    tile.SoftmaxFinalizeOp: KernelEmitter.emit_softmax_finalize,
    tile.ReturnOp: KernelEmitter.emit_return,
    tile.AlibiOp: KernelEmitter.emit_alibi,
    tile.AddBiasOp: KernelEmitter.emit_add_bias,
    tile.ReluProbsOp: KernelEmitter.emit_relu_probs,
    tile.ZerosOp: KernelEmitter.emit_zeros,
    tile.JoinOp: KernelEmitter.emit_join,
    tile.SplitOp: KernelEmitter.emit_split,
    tile.SparseKVLoopOp: KernelEmitter.emit_sparse_kv_loop,
    tile.DocumentMaskOp: KernelEmitter.emit_document_mask,
    tile.QBoundsOp: KernelEmitter.emit_q_bounds,
    tile.QLoopOp: KernelEmitter.emit_q_loop,
    tile.SparseQLoopOp: KernelEmitter.emit_sparse_kv_loop,
    tile.RowDotOp: KernelEmitter.emit_row_dot,
    tile.DotTransposedOp: KernelEmitter.emit_dot_transposed,
    tile.DotLhsTransposedOp: KernelEmitter.emit_dot_lhs_transposed,
    tile.RecomputeProbsOp: KernelEmitter.emit_recompute_probs,
    tile.SoftmaxGradOp: KernelEmitter.emit_softmax_grad,
    tile.ReluGradOp: KernelEmitter.emit_relu_grad,
    tile.ApplyScaleOp: KernelEmitter.emit_apply_scale,
    tile.StoreScoresOp: KernelEmitter.emit_store_scores,
    tile.SeqLenOp: KernelEmitter.emit_seq_len,
    tile.PairPositionOp: KernelEmitter.emit_pair_position,
    tile.QueryHeadOp: KernelEmitter.emit_query_head,
    tile.MapOp: KernelEmitter.emit_map,
}
