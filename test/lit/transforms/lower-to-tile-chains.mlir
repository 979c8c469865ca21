// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false}' | filecheck %s

// lower-to-tile lowers the score chain op by op along the data flow: two chained ALiBis are
// applied twice (they read one slopes tensor: both use the default slopes).
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK-SAME:    %slopes: !tile.tensor<slopes>
// CHECK-NOT:     !tile.tensor<slopes_1>
// CHECK:         tile.kv_loop
// CHECK:           %[[S:.*]] = tile.scores
// CHECK-NEXT:      %[[A:.*]] = tile.alibi %[[S]], %slopes
// CHECK-NEXT:      %[[B:.*]] = tile.alibi %[[A]], %slopes
// CHECK:           tile.softmax_update %[[B]]
attn.variant @double_alibi(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %b = attn.alibi %a
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Two ALiBis with different slopes read two slopes tensors.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK-SAME:    %slopes: !tile.tensor<slopes>, %slopes_1: !tile.tensor<slopes_1>
// CHECK:           %[[A:.*]] = tile.alibi %{{.*}}, %slopes
// CHECK-NEXT:      tile.alibi %[[A]], %slopes_1
attn.variant @two_slopes(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = [0.5 : f64]}
  %b = attn.alibi %a {slopes = [0.25 : f64]}
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// An ALiBi whose result nothing reads computes nothing: no tile.alibi, no slopes argument.
// CHECK-LABEL: tile.kernel @attention_fwd
// CHECK-NOT:     slopes
// CHECK-NOT:     tile.alibi
// CHECK:         tile.return
attn.variant @unused_alibi(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %unused = attn.alibi %s
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// `convert-attn-to-tile` is lower-to-tile under MLIR's A-to-B name; query-block kernels hand
// out their row blocks longest first.
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,convert-attn-to-tile{head-dim=64 backward=false}' | filecheck %s --check-prefix=ALIAS
// ALIAS: tile.kernel @attention_fwd
// ALIAS-SAME: block_order = #tile<order descending>
attn.variant @alias(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
