// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false}' | filecheck %s

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

// -----

// A mask written before the cap still drops its keys: the kernels apply filters after every
// modifier (a dropped key is a mark; capping its -inf would give the finite -cap).
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK:         tile.kv_loop {{.*}} masked
// CHECK:           %[[C:.*]] = tile.map(%{{.*}})
// CHECK:             math.tanh
// CHECK:           tile.mask %[[C]]
attn.variant @mask_first(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %c = attn.softcap %m {cap = 2.0 : f64}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

