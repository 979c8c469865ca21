// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128 dkdv-block-m=128 dkdv-block-n=64},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s --check-prefix=OTHER-TILES
// The Gluon fused backward under documents (block lists): every partition walks, head by head
// of the group, the entries of the key block's query lists (full blocks first, each list from
// its last entry down, as the range walk goes) as one pipelined range of steps; a step's masks (the band's and the documents') are chosen by its
// index against the full list's count (bound_1); the ordered writers take each entry's turn
// at its query block's counter from the lists' ranks.

// The step functions test the documents in partial steps only.
// CHECK-LABEL: def attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, step, n_start, bound_1, sm_scale, n_q, n_k, doc_ids_base, stride_doc_ids_n,
// CHECK:         if step < bound_1:
// CHECK-NOT:       tile.document_mask
// CHECK:         elif step >= bound_1:
// CHECK:           # tile.document_mask: keep pairs in one document (negative ids are padding)
// CHECK-NEXT:      doc_q = tl.load(doc_ids_base + q_pos * stride_doc_ids_n, mask=(q_pos >= 0) & (q_pos < n_k), other=-1)
// The loader: each head's lists, then its entries.
// CHECK-LABEL: def attention_bwd_dkdv_dq_load(
// CHECK:         for head_in_group in range(group_size):
// CHECK-NEXT:        head = kv_head * group_size + head_in_group
// CHECK:             bound_1 = tl.load(full_q_count_base)
// CHECK-NEXT:        count_1 = tl.load(partial_q_count_base)
// CHECK-NEXT:        n_steps = bound_1 + count_1
// CHECK:             for step in range(n_steps):
// CHECK-NEXT:            start_m = next_start_m * BLOCK_N
// CHECK-NEXT:            if step + 1 < n_steps:
// CHECK-NEXT:                if step + 1 < bound_1:
// CHECK-NEXT:                    next_start_m = tl.load(full_q_blocks_base + (bound_1 - 1 - (step + 1)) * stride_full_q_blocks_d)
// CHECK-NEXT:                else:
// CHECK-NEXT:                    next_start_m = tl.load(partial_q_blocks_base + (n_steps - 1 - (step + 1)) * stride_partial_q_blocks_d)
// CHECK:                 tma_load(q_desc, [batch, head, start_m, 0], ready.index(stage), q_bufs.index(stage))
// CHECK:                 it += 1
// Two writers, each taking every other step; the turn from the ranks (read a step ahead, as
// the blocks are).
// CHECK-LABEL: def attention_bwd_dkdv_dq_dq_write(
// CHECK-NOT:             prev_q_end
// CHECK:                 rank = next_rank
// CHECK:                         next_rank = tl.load(full_q_rank_base + (bound_1 - 1 - (step + 1)) * stride_full_q_rank_d)
// CHECK:                         next_rank = tl.load(partial_q_rank_base + (n_steps - 1 - (step + 1)) * stride_partial_q_rank_d)
// CHECK:                 if it % 2 == WRITER:
// CHECK:                     if rank > 0:
// CHECK-NEXT:                    while gl.atomic_add(counter, 0, sem="acquire") != rank:
// CHECK:                     gl.atomic_xchg(counter, rank + 1, sem="release")
// The consumer points the documents at the batch, reads each step's block at the step (its
// wait for the step's data follows the load anyway) and passes the step's index and count.
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK:         doc_ids_base = doc_ids_ptr + batch * stride_doc_ids_b
// CHECK:             for step in range(n_steps):
// CHECK-NEXT:            if step < bound_1:
// CHECK-NEXT:                start_m = tl.load(full_q_blocks_base + (bound_1 - 1 - step) * stride_full_q_blocks_d)
// CHECK:         probs = attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, step, n_start, bound_1, sm_scale, n_q, n_k, doc_ids_base, stride_doc_ids_n, BLOCK_M, BLOCK_N, S_LAYOUT)
// The entry counts the steps: every entry of every head's lists.
// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK:         total = 0
// CHECK-NEXT:    for head_in_group in range(group_size):
// CHECK:             n_steps = bound_1 + count_1
// CHECK-NEXT:        total += n_steps
// CHECK-NOT:     prev_q_end

// Lists built for other tiles: the schedule cannot retile them, so the kernel stays portable.
// OTHER-TILES: # Not warp-specialized (printed by -t triton): attention_bwd_preprocess, attention_bwd_dkdv_dq, attention_bwd_dq_finish
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
