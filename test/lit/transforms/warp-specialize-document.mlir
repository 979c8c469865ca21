// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false block-m=128 block-n=128},warp-specialize' | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false block-m=64 block-n=32},warp-specialize' | filecheck %s --check-prefix=UNTAKEN
// warp-specialize schedules a document forward (its key loops walk the document lists, the
// partial one filtering by tile.document_mask) keeping the tiles the lists name: 128 rows are
// two consumer warpgroups of 128-key blocks (listed_schedule); the filter stays where it was.
// Tiles the schedule cannot take (32-key blocks) leave the kernel unscheduled, for the
// portable target.

// CHECK:      tile.kernel @attention_fwd(
// CHECK-SAME: %doc_ids: !tile.tensor<doc_ids>
// CHECK-SAME: block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64
// CHECK-SAME: schedule = #tile<schedule warp_specialized>
// CHECK:        tile.sparse_kv_loop %full_blocks
// CHECK-NOT:    tile.document_mask
// CHECK:        tile.sparse_kv_loop %partial_blocks, %partial_count masked
// CHECK:          tile.mask
// CHECK-NEXT:     tile.document_mask

// UNTAKEN:      tile.kernel @attention_fwd(
// UNTAKEN-NOT:  schedule
// UNTAKEN:      tile.document_mask
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
