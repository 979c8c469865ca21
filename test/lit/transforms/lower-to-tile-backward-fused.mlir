// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=fused}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=fused bwd-rope=as_forward}' | filecheck %s --check-prefix=ASFWD
// RUN: not attnfuse-opt %s -p 'lower-to-tile{bwd-dq=bogus}' 2>&1 | filecheck %s --check-prefix=BOGUS
// RUN: attnfuse-opt %S/../inputs/bias-variant.mlir -p 'canonicalize-attn,lower-to-tile{bwd-dq=fused}' | filecheck %s --check-prefixes=BIAS,BIAS-FUSED
// RUN: attnfuse-opt %S/../inputs/bias-variant.mlir -p 'canonicalize-attn,lower-to-tile{bwd-dq=ordered}' | filecheck %s --check-prefixes=BIAS,BIAS-ORDERED
// RUN: attnfuse-opt %S/../inputs/sparse.mlir -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered block-m=32 block-n=32}' | filecheck %s --check-prefix=LISTED

// The fused backward (bwd-dq=fused): the preprocess (softmax), attention_bwd_dkdv_dq (the
// dK/dV kernel that also adds each block pair's dQ part dS K into dq_acc) and
// attention_bwd_dq_finish (dq_acc scaled once, rotated back, stored as dQ) replace the dQ
// kernels. GQA needs nothing in the IR: the loop's rows of dq_acc are the loop's query head's,
// as q's and do's are.

// BOGUS-NOT:  Traceback
// BOGUS:      {{^}}<pass-pipeline>:1:22: error: lower-to-tile: bwd-dq must be separate, fused or ordered, got 'bogus'{{$}}

// An additive bias: the dK/dV kernel adds it to the key-major scores; its `_bias` copy, which
// the runtime launches when the bias requires a gradient, also stores dS as dbias (each block
// pair once: no reduction), then adds the dQ part as the first does. No dQ kernel.
// BIAS-NOT:     @attention_bwd_dq(
// BIAS-NOT:     @attention_bwd_dq_bias(
// BIAS:         tile.kernel @attention_bwd_dkdv_dq(
// BIAS-NOT:       dbias
// BIAS-SAME:      %bias: !tile.tensor<bias>) attributes {grid = #tile<grid key_blocks>
// BIAS-NOT:       store_scores
// BIAS:           tile.add_bias %scores, %bias
// BIAS-NOT:       store_scores
// BIAS:         tile.kernel @attention_bwd_dkdv_dq_bias(
// BIAS-SAME:      %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>) attributes {grid = #tile<grid key_blocks>
// BIAS:           %scores_1 = tile.add_bias %scores, %bias
// BIAS:           %grad_scores = tile.softmax_grad
// BIAS-NEXT:      tile.store_scores %grad_scores, %dbias
// BIAS-FUSED:     tile.store_add %dq_part, %dq_acc[loop, all] :
// BIAS-ORDERED:   tile.store_add %dq_part, %dq_acc[loop, all] in_order %dq_order
// BIAS:           tile.q_loop %full_end to %q_end masked
// BIAS:           tile.store_scores %grad_scores_1, %dbias
// BIAS:         tile.kernel @attention_bwd_dq_finish(
// BIAS-NOT:     @attention_bwd_dq

// Adds in key-block order under a block list: the key blocks visiting a query block need not
// be consecutive, so each list's loop reads its entries' turns (ranks) beside the list.
// LISTED-LABEL: tile.kernel @attention_bwd_dkdv_dq(
// LISTED-SAME:    %dq_order: !tile.tensor<dq_order>, %full_q_blocks: !tile.tensor<full_q_blocks>, %full_q_count: !tile.tensor<full_q_count>, %full_q_rank: !tile.tensor<full_q_rank>, %partial_q_blocks: !tile.tensor<partial_q_blocks>, %partial_q_count: !tile.tensor<partial_q_count>, %partial_q_rank: !tile.tensor<partial_q_rank>)
// LISTED:         tile.sparse_q_loop %full_q_blocks, %full_q_count ranks %full_q_rank : !tile.tensor<full_q_rank> iter_args
// LISTED:           tile.store_add %dq_part, %dq_acc[loop, all] in_order %dq_order
// LISTED:         tile.sparse_q_loop %partial_q_blocks, %partial_q_count ranks %partial_q_rank : !tile.tensor<partial_q_rank> masked iter_args
// LISTED:           tile.store_add %dq_part_1, %dq_acc[loop, all] in_order %dq_order

// RoPE + causal, pre-rotated backward (the default): full-width accumulators; the dQ part
// uses the key block loaded once per program; the finish kernel splits dQ into the rotary
// pairs' halves and applies the rotation's transpose.
// CHECK-NOT:   @attention_bwd_dq_delta
// CHECK-NOT:   @attention_bwd_dkdv(
// CHECK:       tile.kernel @attention_bwd_preprocess(%o: !tile.tensor<o>, %do: !tile.tensor<do>, %delta: !tile.tensor<delta>)
// CHECK:       tile.kernel @attention_bwd_dkdv_dq(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>
// CHECK:         %k = tile.load %k_rot[program, all] : !tile.tensor<k_rot> -> !tile.tile<m x d x f16>
// CHECK:         tile.q_loop %q_start to %full_start masked
// CHECK:           %dk_4 = tile.accumulate %dk_3, %grad_scores, %q
// CHECK-NEXT:      %dq_part = tile.dot_lhs_transposed %grad_scores, %k : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
// CHECK-NEXT:      tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
// CHECK-NEXT:      tile.yield %dk_4, %dv_4
// CHECK:         tile.q_loop %full_start to %full_end iter_args
// CHECK:           tile.store_add %dq_part_1, %dq_acc[loop, all]
// CHECK:         tile.q_loop %full_end to %q_end masked
// CHECK:           tile.store_add %dq_part_2, %dq_acc[loop, all]
// CHECK:         %dk_11 = tile.apply_scale %dk_8 : !tile.tile<m x d x f32>
// CHECK:       tile.kernel @attention_bwd_dq_finish(%dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>
// CHECK-NEXT:    %dq_acc_1 = tile.load %dq_acc[program, all] : !tile.tensor<dq_acc> -> !tile.tile<m x d x f32>
// CHECK-NEXT:    %dq_1 = tile.apply_scale %dq_acc_1 : !tile.tile<m x d x f32>
// CHECK-NEXT:    %dq_lo, %dq_hi = tile.split %dq_1 {pairs = #tile<pairs half>}
// CHECK-NEXT:    %dq_lo_1, %dq_hi_1 = tile.rotate %dq_lo, %dq_hi, %rope_table {positions = #tile<seq query>, inverse}
// CHECK-NEXT:    tile.store %dq_lo_1, %dq[program, half_lo]
// CHECK-NEXT:    tile.store %dq_hi_1, %dq[program, half_hi]
// CHECK-NEXT:    tile.return
// CHECK-NOT:   @attention_bwd_dq(

// With the forward's placement (rotations in registers), the accumulators and dq_acc are
// split into the rotary halves: one dQ part and one store_add per half.
// ASFWD:       tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>, %rope_table: !tile.tensor<rope_table>)
// ASFWD:           %dq_part_lo = tile.dot_lhs_transposed %grad_scores, %k_lo_rot : !tile.tile<m x n x f32>, !tile.tile<m x half x f16> -> !tile.tile<n x half x f32>
// ASFWD-NEXT:      tile.store_add %dq_part_lo, %dq_acc[loop, half_lo] : !tile.tile<n x half x f32> -> !tile.tensor<dq_acc>
// ASFWD-NEXT:      %dq_part_hi = tile.dot_lhs_transposed %grad_scores, %k_hi_rot
// ASFWD-NEXT:      tile.store_add %dq_part_hi, %dq_acc[loop, half_hi]
// ASFWD:       tile.kernel @attention_bwd_dq_finish(%dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>, %rope_table: !tile.tensor<rope_table>)
// ASFWD-NEXT:    %dq_acc_lo = tile.load %dq_acc[program, half_lo] : !tile.tensor<dq_acc> -> !tile.tile<m x half x f32>
// ASFWD-NEXT:    %dq_acc_hi = tile.load %dq_acc[program, half_hi] : !tile.tensor<dq_acc> -> !tile.tile<m x half x f32>
// ASFWD-NEXT:    %dq_lo = tile.apply_scale %dq_acc_lo
// ASFWD-NEXT:    %dq_hi = tile.apply_scale %dq_acc_hi
// ASFWD-NEXT:    %dq_lo_1, %dq_hi_1 = tile.rotate %dq_lo, %dq_hi, %rope_table {positions = #tile<seq query>, inverse}
// ASFWD-NEXT:    tile.store %dq_lo_1, %dq[program, half_lo]
// ASFWD-NEXT:    tile.store %dq_hi_1, %dq[program, half_hi]
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

// ReLU attention has no delta: no preprocess; the dK/dV kernel reads no lse or delta.
// CHECK-NOT:   @attention_bwd_preprocess
// CHECK:       tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>)
// CHECK:           tile.store_add %dq_part, %dq_acc[loop, all]
// CHECK:       tile.kernel @attention_bwd_dq_finish(%dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>)
// CHECK-NEXT:    %dq_acc_1 = tile.load %dq_acc[program, all]
// CHECK-NEXT:    %dq_1 = tile.apply_scale %dq_acc_1 : !tile.tile<m x d x f32>
// CHECK-NEXT:    tile.store %dq_1, %dq[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dq>
// CHECK-NEXT:    tile.return
attn.variant @relu(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
