// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true kv-lens=true page-size=16 head-dim=64 block-m=16 block-n=16}' | filecheck %s
// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true head-dim=64}' | filecheck %s --check-prefix=CONTIGUOUS
// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true kv-lens=true page-size=16 hoist-page-rows=0 head-dim=64}' | filecheck %s --check-prefix=UNHOISTED
// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{kv-lens=true head-dim=64}' | filecheck %s --check-prefix=LENGTHS
// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true decode-pdl=0 head-dim=64}' | filecheck %s --check-prefix=NO-PDL
// RUN: not attnfuse-opt %s -p 'lower-to-tile{decode=true decode-pdl=2}' 2>&1 | filecheck %s --check-prefix=PDL-OPTION

// Split-KV decoding: the forward program on the kv_splits grid, its key range clipped to the
// program's split, partial results stored, then merged; no backward kernels.
// CHECK:      tile.kernel @attention_decode(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>)
// CHECK-SAME: grid = #tile<grid kv_splits>
// CHECK-SAME: page_size = 16 : i64
// CHECK-SAME: page_lookahead = 1 : i64
// CHECK-SAME: hoist_page_rows = 1 : i64
// The merge launches as its programmatic dependent (decode-pdl=1, the default).
// CHECK-SAME: pdl = 1 : i64
// UNHOISTED:  tile.kernel @attention_decode(
// UNHOISTED-SAME: hoist_page_rows = 0 : i64
// CHECK:      %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
// CHECK-NEXT: %split_start, %split_full_start, %split_full_end, %split_end = tile.kv_split %kv_start, %full_start, %full_end, %kv_end
// CHECK-NEXT: tile.kv_loop %split_start to %split_full_end iter_args
// CHECK:      tile.kv_loop %split_full_end to %split_end masked iter_args
// CHECK:      tile.store %out, %o_part[program, all]
// CHECK-NEXT: tile.store %lse, %lse_part[program]
// CHECK:      tile.kernel @attention_merge(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>)
// CHECK-SAME: grid = #tile<grid query_blocks>
// CHECK-SAME: pdl = 1 : i64
// CHECK-NEXT: %out, %lse_1 = tile.merge_splits %o_part, %lse_part weighted
// CHECK-NEXT: tile.store %out, %o[program, all]
// CHECK-NEXT: tile.store %lse_1, %lse[program]
// CHECK-NOT:  tile.kernel

// CONTIGUOUS:     tile.kernel @attention_decode(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>)
// CONTIGUOUS-NOT: page_size
// CONTIGUOUS:     tile.kernel @attention_merge

// decode-pdl=0: ordinary launches, no pdl attribute on either kernel.
// NO-PDL:     tile.kernel @attention_decode(
// NO-PDL-NOT: pdl
// NO-PDL:     tile.kernel @attention_merge(
// NO-PDL-NOT: pdl
// PDL-OPTION: error: lower-to-tile: decode-pdl must be 0 or 1, got 2

// Per-sequence lengths alone keep the forward kernel (a prefill into a cache), without backward.
// LENGTHS:     tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %kv_lens: !tile.tensor<kv_lens>)
// LENGTHS-SAME: grid = #tile<grid query_blocks>
// LENGTHS-NOT: tile.kernel
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true decode-merge=last-split head-dim=64}' | filecheck %s --check-prefix=LAST
// RUN: attnfuse-opt %s -p 'analyze-masks,place-rope,lower-to-tile{decode=true decode-merge=last-split merge-stages=2 head-dim=64}' -t triton | filecheck %s --check-prefix=LAST-TRITON
// RUN: not attnfuse-opt %s -p 'lower-to-tile{decode=true decode-merge=tree}' 2>&1 | filecheck %s --check-prefix=MERGE-OPTION
// One kernel: the last split program of each row block merges the partials and stores o, lse.
// LAST:      tile.kernel @attention_decode(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %split_counts: !tile.tensor<split_counts>)
// The one kernel has no dependent to launch early: no pdl attribute.
// LAST-NOT:  pdl
// LAST:      tile.store %lse_1, %lse_part[program]
// LAST-NEXT: tile.merge_last_split %o_part, %lse_part, %split_counts into %o, %lse weighted
// LAST-NOT:  tile.kernel
// LAST-TRITON-NOT:  gdc_
// LAST-TRITON:      arrived = tl.atomic_add(count_ptr, 1)
// LAST-TRITON-NEXT: if arrived == num_splits - 1:
// The last split's merge reads other programs' partials past L1 and is never pipelined.
// The last program merges its 64 rows, 2 splits a step at head dim 64 (8192 fp32 values).
// LAST-TRITON:          for step in range(0, num_splits, 2):
// LAST-TRITON:              split_out = tl.load({{.*}}cache_modifier=".cg")
// LAST-TRITON-NEXT:         split_lse = tl.load({{.*}}cache_modifier=".cg")
// LAST-TRITON:          tl.atomic_xchg(count_ptr, 0)
// MERGE-OPTION: error: lower-to-tile: decode-merge must be kernel or last-split, got 'tree'
