// RUN: attnfuse-opt %s -p 'lower-to-tile{decode=true head-dim=64}' | filecheck %s

// A pointwise normalizer's output is a sum over keys: the splits' outputs add, and there is
// no log-sum-exp to store.
// CHECK:      tile.kernel @attention_decode
// CHECK:      tile.relu_probs
// CHECK:      tile.store %{{.*}}, %o_part[program, all]
// CHECK-NOT:  %lse_part[program]
// CHECK:      tile.kernel @attention_merge(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>)
// CHECK-NEXT: %out, %lse = tile.merge_splits %o_part, %lse_part : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
// CHECK-NEXT: tile.store %out, %o[program, all]
// CHECK-NEXT: tile.return
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
