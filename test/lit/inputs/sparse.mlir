// Input for transforms/lower-to-tile-errors.mlir: a block size smaller than the tiles.

attn.variant @sparse(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %l = attn.block_sparse %s, %layout {block_size = 32 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
