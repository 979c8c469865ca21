// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile' 2>&1 | filecheck %s

// Two document filters would share one doc_ids kernel argument: lower-to-tile says so.
// CHECK: lower-to-tile-document-errors.mlir:[[# @LINE + 4]]:3: error: lower-to-tile: more than one document in one variant
attn.variant @two(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %e = attn.document %d, %doc_ids
  %p = attn.softmax %e
  %o = attn.pv %p, %v
  attn.yield %o
}
