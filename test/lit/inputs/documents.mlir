// Input for targets/triton-head-major.mlir: packed sequences (document ids, no band), whose
// forward keeps the block-major grid.

attn.variant @documents(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %p = attn.softmax %d
  %o = attn.pv %p, %v
  attn.yield %o
}
