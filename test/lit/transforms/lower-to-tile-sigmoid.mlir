// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64}' | filecheck %s

// Sigmoid attention: the probabilities are a tile.map of the scores and Nk (the default bias
// -ln(Nk)); no log-sum-exp, no row statistics, and a backward without delta.
// CHECK-LABEL: tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>)
// CHECK:         %acc = tile.zeros
// CHECK:         tile.kv_loop
// CHECK:           %num_keys = tile.seq_len {axis = #tile<seq key>} : f32
// CHECK-NEXT:      %probs = tile.map(%{{.*}}, %num_keys)
// CHECK:             math.log
// CHECK:             math.exp
// CHECK:           tile.accumulate %{{.*}}, %probs, %v
// CHECK-NOT:     tile.softmax
// CHECK-NOT:     @attention_bwd_preprocess
// CHECK-LABEL: tile.kernel @attention_bwd_dkdv
// CHECK-NOT:     delta
// CHECK:           %grad_scores = tile.map(%probs{{.*}}, %grad_probs{{.*}})
attn.variant @sigmoid(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.sigmoid %m
  %o = attn.pv %p, %v
  attn.yield %o
}
