// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128 dkdv-block-m=128 dkdv-block-n=64},warp-specialize' | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128},warp-specialize' | filecheck %s --check-prefix=OTHER
// warp-specialize on a fused backward over block lists (documents): the runtime builds the
// lists per call for the kernel's tiles, so the schedule takes the kernel only where it already
// has its own (128 keys, 64 queries a step) and then changes none of them; on other tiles the
// kernel keeps the portable schedule, tiles untouched.

// CHECK-LABEL: tile.kernel @attention_bwd_dkdv_dq(
// CHECK-SAME:    %full_q_rank: !tile.tensor<full_q_rank>
// CHECK-SAME:    block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 2 : i64}
// CHECK:         tile.sparse_q_loop %full_q_blocks, %full_q_count ranks %full_q_rank
// CHECK:         tile.sparse_q_loop %partial_q_blocks, %partial_q_count ranks %partial_q_rank : !tile.tensor<partial_q_rank> masked

// OTHER-LABEL: tile.kernel @attention_bwd_dkdv_dq(
// OTHER-SAME:    block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64} {
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
