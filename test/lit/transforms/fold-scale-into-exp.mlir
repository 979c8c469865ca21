// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64},fold-scale-into-exp' | filecheck %s

// Causal softmax: the scores reach only masks and exponentials, forward (softmax_update)
// and backward (recompute_probs): they stay unscaled and the exponentials apply sm_scale.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK:         tile.scores{{.*}} {unscaled}
// CHECK:         tile.softmax_update {{.*}} {unscaled_scores}
// CHECK-LABEL: tile.kernel @attention_bwd_dkdv
// CHECK:         tile.scores{{.*}} {unscaled}
// CHECK:         tile.recompute_probs {{.*}} {unscaled_scores}
attn.variant @causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// A document filter, like a mask, keeps a dropped score at -inf however it is scaled: the
// partial blocks' scores (document_mask, then the causal mask) are folded as the full ones'.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK:         tile.sparse_kv_loop %full_blocks
// CHECK:         tile.scores{{.*}} {unscaled}
// CHECK:         tile.softmax_update {{.*}} {unscaled_scores}
// CHECK:         tile.sparse_kv_loop %partial_blocks
// CHECK:         tile.scores{{.*}} {unscaled}
// CHECK:         tile.document_mask
// CHECK:         tile.softmax_update {{.*}} {unscaled_scores}
// CHECK-LABEL: tile.kernel @attention_bwd_dkdv
// CHECK:         tile.document_mask
// CHECK:         tile.recompute_probs {{.*}} {unscaled_scores}
attn.variant @document(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// A static scale travels with the fold.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK:         tile.scores{{.*}} {scale = 3.000000e-01 : f64, unscaled}
// CHECK:         tile.softmax_update {{.*}} {unscaled_scores, scale = 3.000000e-01 : f64}
attn.variant @static(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k {scale = 0.3 : f64}
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// ALiBi must see scaled scores: nothing is folded, anywhere.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK-NOT:     unscaled
// CHECK:         tile.return
attn.variant @alibi(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// ReLU attention has no exponential: nothing to fold into.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK-NOT:     unscaled
// CHECK:         tile.return
attn.variant @relu(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
