// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false}' | filecheck %s

// The kernels: the cap is a tile.map (cap * tanh(s / cap)) after ALiBi, before the mask.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK:         tile.kv_loop {{.*}} masked
// CHECK:           %[[A:.*]] = tile.alibi
// CHECK-NEXT:      %[[C:.*]] = tile.map(%[[A]])
// CHECK:             arith.divf
// CHECK-NEXT:        math.tanh
// CHECK-NEXT:        arith.mulf
// CHECK-NEXT:        tile.map_yield
// CHECK:           tile.mask %[[C]]
attn.variant @tile(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %c = attn.softcap %a {cap = 2.0 : f64}
  %m = attn.mask %c [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
