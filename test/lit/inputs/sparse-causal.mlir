// Input for targets/triton-head-major.mlir: a block-sparse layout under a causal band, whose
// forward keeps the block-major grid (longest programs first).

attn.variant @sparse_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %l = attn.block_sparse %m, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
