// RUN: not attnfuse-opt %S/../inputs/sparse.mlir -p 'analyze-masks,lower-to-tile{decode=true block-m=32 block-n=32}' 2>&1 | filecheck %s --check-prefix=SPARSE
// RUN: not attnfuse-opt %s -p 'lower-to-tile{page-size=16}' 2>&1 | filecheck %s --check-prefix=PAGES
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{key=pre_rotated},lower-to-tile{kv-lens=true page-size=16}' 2>&1 | filecheck %s --check-prefix=ROTATED
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=pre_rotated key=fused},lower-to-tile{decode=true kv-lens=true}' 2>&1 | filecheck %s --check-prefix=QUERY

// A block-granular filter has no per-entry test for split programs to apply.
// SPARSE: sparse.mlir:5:3: error: lower-to-tile: attn.block_sparse keeps whole blocks from per-query-block lists, which decode kernels (decode=true) do not have
// A paged cache needs per-sequence lengths.
// PAGES: <pass-pipeline>:1:15: error: lower-to-tile: page-size=16 needs kv-lens=true: the pages do not say how many keys each sequence has
// A page pool's rows are not positions: its keys cannot be pre-rotated.
// A query's positions follow kv_lens, which only the attention kernels read.
// QUERY: rope.mlir:3:1: error: lower-to-tile: a query with per-sequence lengths (kv-lens=true) cannot be pre-rotated (its positions depend on kv_lens): place it fused
// ROTATED: rope.mlir:3:1: error: lower-to-tile: the key of a paged cache cannot be pre-rotated (its rows are pages, not positions): place the key rotation fused or given
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
