// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=ordered bwd-block-m=64 bwd-block-n=32}' -t triton | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=ordered bwd-rope=as_forward bwd-block-m=64 bwd-block-n=32}' -t triton | filecheck %s --check-prefix=PARTS
// The portable target's fused backward with its dQ adds in key-block order (bwd-dq=ordered):
// causal, so every earlier key block visits every later query (prev_q_end = n_q). Before the
// block pair's atomics the program waits (acquire) until the previous key block has handed
// the query block's counter on; after them, and a barrier, it hands it on (release).

// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK:         dq_order_ptr, stride_dq_order_b, stride_dq_order_h, stride_dq_order_n,
// CHECK:         prev_q_end = n_q  # every earlier key block visits every later query
// CHECK:         dq_order_base = dq_order_ptr + batch * stride_dq_order_b + head * stride_dq_order_h
// CHECK:         # tile.store_add: added into dq_acc rows (loop), all columns (in key-block order)
// CHECK-NEXT:    order_counter = dq_order_base + start_m * stride_dq_order_n
// CHECK-NEXT:    if (block_id > 0) & (start_m < prev_q_end):
// CHECK-NEXT:        while tl.atomic_add(order_counter, 0, sem="acquire") != block_id:
// CHECK-NEXT:            pass
// CHECK-NEXT:    tl.atomic_add(dq_acc_base + {{.*}}, dq_part, mask={{.*}}, sem="relaxed")
// CHECK-NEXT:    tl.debug_barrier()
// CHECK-NEXT:    tl.atomic_xchg(order_counter, block_id + 1, sem="release")
attn.variant @causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// RoPE fused in the loops: the dQ part is added by column parts, which share the query
// block's one counter: the first part's add waits, the last one's hands the block on.
// PARTS-LABEL: def attention_bwd_dkdv_dq(
// PARTS:         # tile.store_add: added into dq_acc rows (loop), first halves of the rotary pairs (in key-block order)
// PARTS-NEXT:    order_counter = dq_order_base + start_m * stride_dq_order_n
// PARTS:         tl.atomic_add(dq_acc_base
// PARTS-NOT:     tl.atomic_xchg
// PARTS:         # tile.store_add: added into dq_acc rows (loop), second halves of the rotary pairs (in key-block order)
// PARTS-NOT:     order_counter_1 =
// PARTS:         tl.atomic_add(dq_acc_base
// PARTS-NEXT:    tl.debug_barrier()
// PARTS-NEXT:    tl.atomic_xchg(order_counter, block_id + 1, sem="release")
attn.variant @rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Documents: the key blocks visiting a query block come from lists, so need not be
// consecutive. Each list entry's turn (rank: how many lower key blocks visit its query block)
// is read beside it; the counter counts the adds made, and a program waits unless it is the
// first visitor, then hands on to the next turn.
// CHECK-LABEL:   full_q_rank_ptr, stride_full_q_rank_b, stride_full_q_rank_h, stride_full_q_rank_n, stride_full_q_rank_d,
// CHECK-NOT:     prev_q_end
// CHECK:         # tile.sparse_q_loop over the query blocks the layout lists (full: no mask work)
// CHECK:         full_q_rank_base = full_q_rank_ptr + batch * stride_full_q_rank_b + head * stride_full_q_rank_h + block_id * stride_full_q_rank_n
// CHECK:         start_m = tl.load(full_q_blocks_base + entry * stride_full_q_blocks_d) * BLOCK_N
// CHECK-NEXT:    rank = tl.load(full_q_rank_base + entry * stride_full_q_rank_d)
// CHECK:         order_counter = dq_order_base + start_m * stride_dq_order_n
// CHECK-NEXT:    if rank > 0:
// CHECK-NEXT:        while tl.atomic_add(order_counter, 0, sem="acquire") != rank:
// CHECK-NEXT:            pass
// CHECK:         tl.atomic_xchg(order_counter, rank + 1, sem="release")
// CHECK:         # tile.sparse_q_loop over the query blocks the layout lists (partial: masked and bounds-checked)
// CHECK:         rank = tl.load(partial_q_rank_base + entry * stride_partial_q_rank_d)
// CHECK:         tl.atomic_xchg(order_counter_1, rank + 1, sem="release")
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
