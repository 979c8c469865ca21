// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s
// Verifier errors of the backward tile ops, one per split. Messages are anchored at the start
// of a line: each split's diagnostic is printed first, ahead of the annotated IR.

// q_loop walks query blocks: programs must own key blocks.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.q_loop needs a kernel whose programs own key blocks

// -----

// kv_loop walks key blocks: programs must own query blocks.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.kv_loop needs a kernel whose programs own query blocks

// -----

// q_bounds: the query range of a key block.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  tile.return
}
// CHECK: {{^}}tile.q_bounds needs a kernel whose programs own key blocks

// -----

// kv_bounds in a key_blocks kernel.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  tile.return
}
// CHECK: {{^}}tile.kv_bounds needs a kernel whose programs own query blocks

// -----

// sparse_q_loop in a query_blocks kernel.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %fqb, %fqc iter_args(%a) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.sparse_q_loop needs a kernel whose programs own key blocks

// -----

// sparse_q_loop mixing a full list with a partial count.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %fqb, %pqc iter_args(%a) : !tile.tensor<full_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}sparse_q_loop reads a block list and its count: full_q_blocks and full_q_count, or partial_q_blocks and partial_q_count

// -----

// sparse_q_loop reading key-block lists (the forward's roles).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %fb, %fc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}sparse_q_loop reads a block list and its count: full_q_blocks and full_q_count, or partial_q_blocks and partial_q_count

// -----

// A q_loop yields the types of its iter_args.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %z = tile.zeros : !tile.tile<m x dv x f32>
    tile.yield %z : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.yield must yield the types of the loop's iter_args

// -----

// tile.mask needs a masked q_loop.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %s = tile.scores(%kb) x(%qb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s1m = tile.mask %s {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.mask belongs in a masked tile.kv_loop or tile.q_loop

// -----

// recompute_probs: in a key_blocks kernel the queries are the loop rows, so lse is <n>.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %lse_m = tile.zeros : !tile.tile<m x f32>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %s = tile.scores(%kb) x(%qb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %p = tile.recompute_probs %s, %lse_m : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}log-sum-exp must run along the query axis, <n> in a key_blocks kernel

// -----

// recompute_probs: in a query_blocks kernel lse is <m>.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %qb = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%qb) x(%kb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %lse_n = tile.zeros : !tile.tile<n x f32>
    %p = tile.recompute_probs %s, %lse_n : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}log-sum-exp must run along the query axis, <m> in a query_blocks kernel

// -----

// softmax_grad: delta along the wrong axis (<m> in a key_blocks kernel).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %delta_m = tile.zeros : !tile.tile<m x f32>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %s = tile.scores(%kb) x(%qb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %ds = tile.softmax_grad %s, %s, %delta_m : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}delta must run along the query axis, <n> in a key_blocks kernel

// -----

// softmax_grad: delta along the wrong axis (<n> in a query_blocks kernel).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %qb = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%qb) x(%kb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %delta_n = tile.zeros : !tile.tile<n x f32>
    %ds = tile.softmax_grad %s, %s, %delta_n : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}delta must run along the query axis, <m> in a query_blocks kernel

// -----

// recompute_probs: lse is a vector, not a score tile.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %qb = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%qb) x(%kb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %p = tile.recompute_probs %s, %s : !tile.tile<m x n x f32>, !tile.tile<m x n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}log-sum-exp must be an f32 <m> or <n> tile, got !tile.tile<m x n x f32>

// -----

// recompute_probs works on fp32 scores.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %lse_m = tile.zeros : !tile.tile<m x f32>
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %p = tile.recompute_probs %x, %lse_m : !tile.tile<m x d x f16>, !tile.tile<m x f32>
  tile.return
}
// CHECK: {{^}}scores must be a m x n tile, got m x d

// -----

// dot_transposed contracts matching column dims: dv against d.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %vb = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %dp = tile.dot_transposed %vb, %qb : !tile.tile<m x dv x f16>, !tile.tile<n x d x f16> -> !tile.tile<m x n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}right operand must be <n x dv>, got n x d

// -----

// dot_transposed: the left operand runs over the program's rows.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %vb = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %dp = tile.dot_transposed %vb, %vb : !tile.tile<n x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}left operand must be <m x _>, got n x dv

// -----

// dot_transposed: the result is m x n fp32.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
    %vb = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %dp = tile.dot_transposed %g, %vb : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f16>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}product must be f32, got f16

// -----

// store_scores writes dbias only.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %qb = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%qb) x(%kb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    tile.store_scores %s, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.store_scores writes the dbias tensor

// -----

// store_scores stores the current block: it belongs in a loop.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x n x f32>
  tile.store_scores %z, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
  tile.return
}
// CHECK: {{^}}tile.store_scores works on a key block: it belongs in a key loop

// -----

// store_scores stores a score-shaped tile.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    tile.store_scores %kb, %dbias : !tile.tile<n x d x f16>, !tile.tensor<dbias>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}stored scores must be a m x n tile, got n x d

// -----

// split takes a full-width <rows x d> tile.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x half x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs half>} : !tile.tile<m x half x f32> -> !tile.tile<m x half x f32>
  tile.return
}
// CHECK: {{^}}a split tile must be <rows x d>, got m x half

// -----

// split takes d, not dv.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x dv x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs half>} : !tile.tile<m x dv x f32> -> !tile.tile<m x half x f32>
  tile.return
}
// CHECK: {{^}}a split tile must be <rows x d>, got m x dv

// -----

// split needs rotary_dim == head_dim.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, rotary_dim = 32 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  tile.return
}
// CHECK: {{^}}tile.split needs rotary_dim == head_dim, a power of two >= 32; got rotary_dim 32, head_dim 64

// -----

// split needs a head dim of at least 32.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs interleaved>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  tile.return
}
// CHECK: {{^}}tile.split needs rotary_dim == head_dim, a power of two >= 32; got rotary_dim 16, head_dim 16

// -----

// split: a known pair layout.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %lo, %hi = tile.split %x {pairs = "blocked"} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  tile.return
}
// CHECK: "blocked" should be of base attribute tile.pairs

// -----

// split keeps the element type.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f16>
  tile.return
}
// CHECK: {{^}}tile.split keeps the element type of its operand

// -----

// split keeps the rows.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %lo, %hi = tile.split %x {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<n x half x f32>
  tile.return
}
// CHECK: {{^}}split halves must be a m x half tile, got n x half

// -----

// apply_scale: a static scale is positive.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %y = tile.apply_scale %x {scale = 0.000000e+00 : f64} : !tile.tile<m x d x f32>
  tile.return
}
// CHECK: {{^}}scale must be positive, got 0.0

// -----

// apply_scale: negative.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  %y = tile.apply_scale %x {scale = -1.250000e-01 : f64} : !tile.tile<m x d x f32>
  tile.return
}
// CHECK: {{^}}scale must be positive, got -0.125

// -----

// apply_scale scales fp32 accumulators.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %y = tile.apply_scale %x : !tile.tile<m x d x f16>
  tile.return
}
// CHECK: {{^}}scaled tile must be f32, got f16

// -----

// row_dot gives one fp32 value per program row: <m>, not <n>.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
  %g = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
  %d = tile.row_dot %g, %out : !tile.tile<m x dv x f16> -> !tile.tile<n x f32>
  tile.return
}
// CHECK: {{^}}row dot must be a m tile, got n

// -----

// row_dot result is fp32.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
  %g = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
  %d = tile.row_dot %g, %out : !tile.tile<m x dv x f16> -> !tile.tile<m x f16>
  tile.return
}
// CHECK: {{^}}row dot must be f32, got f16

// -----

// row_dot operands are program-row tiles.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %lse[program] : !tile.tensor<lse> -> !tile.tile<m x f32>
  %d = tile.row_dot %x, %x : !tile.tile<m x f32> -> !tile.tile<m x f32>
  tile.return
}
// CHECK: {{^}}row_dot operands must be <m x _>, got m

// -----

// relu_grad works on m x n fp32 scores.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x dv x f32>
  %d = tile.relu_grad %x, %x : !tile.tile<m x dv x f32>
  tile.return
}
// CHECK: {{^}}scores must be a m x n tile, got m x dv

// -----

// accumulate: an m x d accumulator takes n x d values.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %s = tile.scores(%kb) x(%qb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %g = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %a1 = tile.accumulate %a0, %s, %g : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}value block must be a n x d tile, got n x dv

// -----

// accumulate: the accumulator runs over the program rows.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %qb = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %s = tile.scores(%kb) x(%qb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %z = tile.zeros : !tile.tile<n x d x f32>
    %a1 = tile.accumulate %z, %s, %qb : !tile.tile<n x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}accumulator must be <m x _>, got n x d

// -----

// Loop rows of a backward tensor outside any loop.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dbias: !tile.tensor<dbias>, %bias: !tile.tensor<bias>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %g = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
  tile.return
}
// CHECK: {{^}}loop rows can only be accessed inside a tile.kv_loop or tile.q_loop

// -----

// delta is fp32 whatever the element type.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %d = tile.load %delta[program] : !tile.tensor<delta> -> !tile.tile<m x f16>
  tile.return
}
// CHECK: {{^}}a loaded delta tile must have element type f32, got f16

// -----

// dbias is not accessed by blocks.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %d = tile.load %dbias[program, all] : !tile.tensor<dbias> -> !tile.tile<m x d x f32>
  tile.return
}
// CHECK: {{^}}a dbias tensor is not accessed by blocks

// -----

// Block roles must match the grid's row axes: q rows are queries, the program's rows of a
// key_blocks kernel are keys.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: {{^}}q rows are query rows, but the program rows of a key_blocks kernel are key rows

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %dk: !tile.tensor<dk>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  tile.store %x, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.return
}
// CHECK: {{^}}dk rows are key rows, but the program rows of a query_blocks kernel are query rows

// -----

// tile.rotate's positions must be those of the rows it rotates.
tile.kernel @k(%k: !tile.tensor<k>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %lo = tile.load %k[program, half_lo] : !tile.tensor<k> -> !tile.tile<m x half x f16>
  %hi = tile.load %k[program, half_hi] : !tile.tensor<k> -> !tile.tile<m x half x f16>
  %a, %b = tile.rotate %lo, %hi, %rope_table {positions = #tile<seq query>} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>
  tile.return
}
// CHECK: {{^}}query positions, but the program rows of a key_blocks kernel are key rows

// -----

// dot_transposed multiplies operands of one element type (a widened q with an f16 k).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %kk = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %qq = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f32>
    %dp = tile.dot_transposed %kk, %qq : !tile.tile<m x d x f16>, !tile.tile<n x d x f32> -> !tile.tile<m x n x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}dot_transposed operands differ in element type

// -----

// A query loop's results have the types of its iter_args.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.q_loop results must have the types of its iter_args

// -----

// A query loop's body arguments have the types of its iter_args.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.q_loop body arguments must have the types of its iter_args
