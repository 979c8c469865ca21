// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{key=pre_rotated},lower-to-tile{head-dim=80 block-m=64 block-n=32 backward=false},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// The Triton target prints each tile.kernel as a @triton.jit function with named values,
// one comment per tile op, and the launch ABI the runtime relies on.

// CHECK:      import triton
// CHECK-NEXT: import triton.language as tl

// CHECK:      @triton.jit
// CHECK-NEXT: def rotate_key(
// CHECK-NEXT:     k_ptr, stride_k_b, stride_k_h, stride_k_n, stride_k_d,
// CHECK-NEXT:     k_rot_ptr, stride_k_rot_b, stride_k_rot_h, stride_k_rot_n, stride_k_rot_d,
// CHECK-NEXT:     rope_table_ptr, stride_rope_table_c, stride_rope_table_n, stride_rope_table_d,
// CHECK-NEXT:     sm_scale, n_q, n_k, num_heads, group_size,
// CHECK-NEXT:     BLOCK_M: tl.constexpr = 64,
// CHECK-NEXT:     BLOCK_N: tl.constexpr = 32,
// CHECK-NEXT:     HEAD_DIM: tl.constexpr = 80,
// CHECK-NEXT:     BLOCK_D: tl.constexpr = 128,
// CHECK:          ROT_DIM: tl.constexpr = 80,
// CHECK-NEXT:     ROT_HALF: tl.constexpr = 40,
// CHECK-NEXT:     BLOCK_HALF: tl.constexpr = 64,
// CHECK:      row_in_bounds = rows < n_k
// Key rows are their own positions in the rotation kernel; cos and sin come from the table.
// CHECK:      tile.rotate: RoPE at key positions
// CHECK-NEXT: table_rows = rows
// CHECK-NEXT: cos = tl.load(rope_table_ptr + table_rows[:, None] * stride_rope_table_n + cols_half[None, :] * stride_rope_table_d, mask=row_in_bounds[:, None] & (cols_half < ROT_HALF)[None, :], other=1.0)
// CHECK-NEXT: sin = tl.load(rope_table_ptr + table_rows[:, None] * stride_rope_table_n + cols_half[None, :] * stride_rope_table_d + stride_rope_table_c, mask=row_in_bounds[:, None] & (cols_half < ROT_HALF)[None, :], other=0.0)
// CHECK:      k_lo_rot = (k_lo_f32 * cos - k_hi_f32 * sin).to(k_lo.dtype)
// CHECK-NEXT: k_hi_rot = (k_lo_f32 * sin + k_hi_f32 * cos).to(k_hi.dtype)

// CHECK:      def attention_fwd(
// CHECK:      kv_head = head // group_size
// CHECK:      q_pos = rows + (n_k - n_q)
// Half of 80 is not a power of two: loads of rotary halves are masked on columns.
// CHECK:      q_lo = tl.load(q_base + rows[:, None] * stride_q_n + (cols_half)[None, :] * stride_q_d, mask=row_in_bounds[:, None] & (cols_half < ROT_HALF)[None, :], other=0.0)
// Query positions are negative when Nq > Nk: the table holds |pos|, sin takes the sign.
// CHECK:      tile.rotate: RoPE at query positions
// CHECK-NEXT: table_rows = tl.abs(q_pos)
// CHECK:      sin = sin * tl.where(q_pos < 0, -1.0, 1.0)[:, None]
// CHECK:      tile.kv_bounds
// CHECK:      kv_end = tl.minimum(q_last + 1, n_k)
// CHECK:      full_end = tl.maximum(tl.minimum(q_first + 1, n_k), 0) // BLOCK_N * BLOCK_N
// The full blocks: no masks on loads, no tile.mask.
// CHECK:      tile.kv_loop over full key blocks: no mask work
// CHECK-NEXT: for start_n in range(kv_start, full_end, BLOCK_N):
// CHECK:          k_lo = tl.load(k_rot_base + keys[:, None] * stride_k_rot_n + (cols_half)[None, :] * stride_k_rot_d, mask=(cols_half < ROT_HALF)[None, :], other=0.0)
// CHECK:          scores = tl.dot(q_lo_rot, tl.trans(k_lo))
// CHECK-NEXT:     scores = tl.dot(q_hi_rot, tl.trans(k_hi), acc=scores)
// The positive scale is folded into the exponential's FMA and into the row max, which is kept
// in base-2 units (the same product the exponent takes: s * f - max is never positive).
// CHECK-NEXT:     # (the scale, sm_scale, is applied where the scores meet the exponential)
// CHECK-NOT:      tl.where(keep
// CHECK:          row_max_new = tl.maximum(row_max, tl.max(scores, 1) * (sm_scale * 1.4426950408889634))
// The row max starts at the softmax's floor (-2^23, times log2(e)), never -inf: no select in the step.
// CHECK-NEXT:     probs = tl.math.exp2(scores * (sm_scale * 1.4426950408889634) - row_max_new[:, None])
// CHECK:          row_max = row_max_new
// CHECK:          acc = tl.dot(probs.to(v.dtype), v, acc=acc * alpha[:, None])
// The diagonal blocks: bounds-checked and masked.
// CHECK:      tile.kv_loop over partial key blocks: masked and bounds-checked
// CHECK:          key_in_bounds = keys < n_k
// CHECK:          keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None])
// CHECK-NEXT:     scores_2 = tl.where(keep, scores_1, float("-inf"))
// CHECK:      tile.softmax_finalize
// CHECK:      lse = tl.where(has_keys, (row_max + tl.math.log2(row_sum_safe)) * 0.6931471805599453, float("-inf"))
// CHECK:      tl.store(o_base + rows[:, None] * stride_o_n + (cols_dv)[None, :] * stride_o_d, out.to(o_ptr.dtype.element_ty), mask=row_in_bounds[:, None] & (cols_dv < HEAD_DIM_V)[None, :])
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
