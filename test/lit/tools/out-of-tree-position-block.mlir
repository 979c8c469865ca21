// RUN: attnfuse-opt --block-module %S/../../python/blocks/fire_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t triton | filecheck %s
// RUN: attnfuse-opt --block-module %S/../../python/blocks/fire_block.py %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 bwd-dq=fused},fold-scale-into-exp,warp-specialize' | filecheck %s --check-prefix=SCHEDULE
// RUN: attnfuse-opt --block-module %S/../../python/blocks/fire_block.py %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s --check-prefix=GLUON
// RUN: attnfuse-opt --block-module %S/../../python/blocks/fire_block.py %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 bwd-dq=fused},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s --check-prefix=GLUON-BWD
// A block that reads positions and the query head (fire_log, in one file beside its pytest
// tests: docs/architecture.md §10.1) lowers to `tile.pair_position` and `tile.query_head` and
// one map, printed in each kernel's orientation: in the forward (and dQ) the program's rows
// are queries and the loop's keys; in dK/dV the rows are keys and the loop walks the GQA
// group's query heads.

// CHECK-LABEL: def attention_fwd(
// CHECK:       tile.pair_position: each entry's query position
// CHECK-NEXT:  q_position = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + q_pos[:, None]
// CHECK:       k_position = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + keys[None, :]
// CHECK:       query_head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + head
// CHECK:       tl.log(
// CHECK-LABEL: def attention_bwd_dkdv(
// CHECK:       for head_in_group in range(0, group_size):
// CHECK:       head = kv_head * group_size + head_in_group
// CHECK:       q_position = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + q_pos[None, :]
// CHECK:       k_position = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + rows[:, None]
// CHECK:       query_head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + head

// warp-specialize schedules the forward and the fused backward (their index tiles sit among
// the score ops).
// SCHEDULE:       tile.kernel @attention_fwd({{.*}} schedule = #tile<schedule warp_specialized>
// SCHEDULE:       tile.kernel @attention_bwd_dkdv_dq({{.*}} schedule = #tile<schedule warp_specialized>

// The Gluon step prints them in the score tile's layout, and takes the tile's query head.
// GLUON-LABEL: def attention_fwd_step(
// GLUON-SAME:  n_q, n_k, head,
// GLUON:       q_position = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + q_pos[:, None]
// GLUON:       k_position = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + keys[None, :]
// GLUON:       query_head = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + head
// GLUON:       tl.log(
// GLUON-LABEL: def attention_fwd_consume(
// GLUON:       attention_fwd_step(scores, {{.*}}, n_q, n_k, head, ROWS, BLOCK_N, S_LAYOUT)

// The Gluon backward's probability step takes the step's query head and builds the index
// values from its rows (keys) and query positions, broadcast where the map uses them (not
// whole tiles: registers).
// GLUON-BWD-LABEL: def attention_bwd_dkdv_dq_probs(
// GLUON-BWD-SAME:  n_q, n_k, head, BLOCK_M
// GLUON-BWD:       q_position = (q_pos[None, :]).to(gl.float32)
// GLUON-BWD:       k_position = (rows[:, None]).to(gl.float32)
// GLUON-BWD:       query_head = (head).to(gl.float32)
// GLUON-BWD:       scores = (scores - {{.*}}tl.log(
// GLUON-BWD-LABEL: def attention_bwd_dkdv_dq_consume(
// GLUON-BWD:       attention_bwd_dkdv_dq_probs(scores, lse_log2, {{.*}}, n_q, n_k, head, BLOCK_M, BLOCK_N, S_LAYOUT)

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.fire_log %s {r1 = 8.000000e-01 : f64, c = 5.000000e-01 : f64, threshold = 6.000000e+00 : f64}
  %m = attn.mask %b [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
