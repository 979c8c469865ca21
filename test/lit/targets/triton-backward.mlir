// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-block-m=64 bwd-block-n=32},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-rope=as_forward bwd-block-m=64 bwd-block-n=32},fold-scale-into-exp,share-offsets' -t triton | filecheck %s --check-prefix=ASFWD
// The Triton of the backward kernels for causal RoPE (default: pre-rotated q and k). The dK/dV
// kernel's programs own key blocks (BLOCK_M keys) of one key/value head and loop over query
// blocks (BLOCK_N queries) for every query head of the GQA group; the dQ kernel's programs own
// query blocks, heaviest (last) first.

// CHECK-LABEL: def attention_bwd_dkdv(
// CHECK-NEXT:     q_rot_ptr, stride_q_rot_b, stride_q_rot_h, stride_q_rot_n, stride_q_rot_d,
// CHECK-NEXT:     k_rot_ptr, stride_k_rot_b, stride_k_rot_h, stride_k_rot_n, stride_k_rot_d,
// CHECK-NEXT:     v_ptr, stride_v_b, stride_v_h, stride_v_n, stride_v_d,
// CHECK-NEXT:     do_ptr, stride_do_b, stride_do_h, stride_do_n, stride_do_d,
// CHECK-NEXT:     lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n,
// CHECK-NEXT:     delta_ptr, stride_delta_b, stride_delta_h, stride_delta_n,
// CHECK-NEXT:     dk_ptr, stride_dk_b, stride_dk_h, stride_dk_n, stride_dk_d,
// CHECK-NEXT:     dv_ptr, stride_dv_b, stride_dv_h, stride_dv_n, stride_dv_d,
// CHECK-NEXT:     rope_table_ptr, stride_rope_table_c, stride_rope_table_n, stride_rope_table_d,
// CHECK-NEXT:     sm_scale, n_q, n_k, num_heads, group_size,
// CHECK-NEXT:     BLOCK_M: tl.constexpr = 64,
// CHECK-NEXT:     BLOCK_N: tl.constexpr = 32,
// dO and q are loaded full width in the query loop and D = Dv: the runtime sets SHARED_OFFSETS
// when their strides match, and dO's loads then reuse q's offsets.
// CHECK:          SHARED_OFFSETS: tl.constexpr = False,
// CHECK-NEXT: ):

// The key_blocks prologue: the program's rows are keys of its key/value head.
// CHECK:          # Program grid (one program per (batch x key/value head, key block)).
// CHECK-NEXT:     block_id = tl.program_id(1)
// CHECK-NEXT:     batch_head = tl.program_id(0)
// CHECK-NEXT:     batch = (batch_head // num_heads).to(tl.int64)
// CHECK-NEXT:     head = (batch_head % num_heads).to(tl.int64)
// CHECK-NEXT:     kv_head = head  # programs of a key_blocks grid own a key/value head
// CHECK-NEXT:     rows = block_id * BLOCK_M + tl.arange(0, BLOCK_M)
// CHECK-NEXT:     row_in_bounds = rows < n_k
// The program's own tensors are addressed by kv_head; per-query tensors only inside the loops.
// CHECK-NOT:      q_rot_base =
// CHECK:          k_rot_base = k_rot_ptr + batch * stride_k_rot_b + kv_head * stride_k_rot_h
// CHECK-NEXT:     v_base = v_ptr + batch * stride_v_b + kv_head * stride_v_h
// CHECK-NEXT:     dk_base = dk_ptr + batch * stride_dk_b + kv_head * stride_dk_h
// CHECK-NEXT:     dv_base = dv_ptr + batch * stride_dv_b + kv_head * stride_dv_h
// CHECK-NOT:      q_rot_base =
// CHECK:          k = tl.load(k_rot_base + rows[:, None] * stride_k_rot_n + (cols_d)[None, :] * stride_k_rot_d, mask=row_in_bounds[:, None], other=0.0)
// CHECK:          dk = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

// tile.q_bounds for the causal band (key j is kept by query i iff j <= q_pos(i)): the first
// query that sees the block's first key, the first that sees its last (in-bounds) key; the
// partial ranges round outwards to query blocks of BLOCK_N.
// CHECK:          # tile.q_bounds: query blocks that visit this key block (band q_pos + [None, 0])
// CHECK-NEXT:     diag_first = block_id * BLOCK_M - (n_k - n_q)
// CHECK-NEXT:     diag_last = tl.minimum(block_id * BLOCK_M + BLOCK_M, n_k) - 1 - (n_k - n_q)
// CHECK-NEXT:     q_start = tl.maximum(diag_first, 0) // BLOCK_N * BLOCK_N
// CHECK-NEXT:     full_start = (tl.maximum(diag_last, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
// CHECK-NEXT:     q_end = n_q
// CHECK-NEXT:     full_end = n_q // BLOCK_N * BLOCK_N
// CHECK-NEXT:     # Full blocks lie inside [start, end); blocks outside it are empty and skipped.
// CHECK-NEXT:     full_start = tl.minimum(tl.maximum(full_start, q_start), q_end)
// CHECK-NEXT:     full_end = tl.minimum(tl.maximum(full_end, full_start), q_end)
// CHECK-NEXT:     # A ragged last key block has padded rows: every query block is partial for it.
// CHECK-NEXT:     full_end = tl.where(block_id * BLOCK_M + BLOCK_M <= n_k, full_end, full_start)

// The first q_loop (partial blocks): an outer loop over the query heads of the group, each
// rebasing the per-query tensors, then the query blocks, bounds-checked and masked.
// CHECK-NEXT:     # tile.q_loop over partial query blocks: masked and bounds-checked, for each query head of this key/value head
// CHECK-NEXT:     for head_in_group in range(0, group_size):
// CHECK-NEXT:         head = kv_head * group_size + head_in_group
// CHECK-NEXT:         q_rot_base = q_rot_ptr + batch * stride_q_rot_b + head * stride_q_rot_h
// CHECK-NEXT:         do_base = do_ptr + batch * stride_do_b + head * stride_do_h
// CHECK-NEXT:         lse_base = lse_ptr + batch * stride_lse_b + head * stride_lse_h
// CHECK-NEXT:         delta_base = delta_ptr + batch * stride_delta_b + head * stride_delta_h
// CHECK-NEXT:         for start_m in range(q_start, full_start, BLOCK_N):
// CHECK-NEXT:             start_m = tl.multiple_of(start_m, BLOCK_N)
// CHECK-NEXT:             queries = start_m + tl.arange(0, BLOCK_N)
// CHECK-NEXT:             query_in_bounds = queries < n_q
// CHECK-NEXT:             q_pos = queries + (n_k - n_q)
// CHECK-NEXT:             # tile.load: q_rot rows (loop), all columns
// CHECK-NEXT:             q = tl.load(q_rot_base + queries[:, None] * stride_q_rot_n + (cols_d)[None, :] * stride_q_rot_d, mask=query_in_bounds[:, None], other=0.0)
// CHECK-NEXT:             # tile.load: do rows (loop), all columns
// CHECK-NEXT:             if SHARED_OFFSETS:
// CHECK-NEXT:                 grad_out = tl.load(do_base + queries[:, None] * stride_q_rot_n + (cols_d)[None, :] * stride_q_rot_d, mask=query_in_bounds[:, None], other=0.0)
// CHECK-NEXT:             else:
// CHECK-NEXT:                 grad_out = tl.load(do_base + queries[:, None] * stride_do_n + (cols_dv)[None, :] * stride_do_d, mask=query_in_bounds[:, None], other=0.0)
// CHECK:                  lse = tl.load(lse_base + queries * stride_lse_n, mask=query_in_bounds, other=float("inf"))
// CHECK:                  delta = tl.load(delta_base + queries * stride_delta_n, mask=query_in_bounds, other=0.0)
// Scores are key x query: keys are the program's rows.
// CHECK:                  scores = tl.dot(k, tl.trans(q))
// The scale is folded into the exponential's multiplier: no multiply of the scores.
// CHECK-NEXT:             # (the scale, sm_scale, is applied where the scores meet the exponential)
// CHECK-NEXT:             # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK-NEXT:             keep = query_in_bounds[None, :] & row_in_bounds[:, None] & (rows[:, None] <= q_pos[None, :])
// CHECK-NEXT:             scores_1 = tl.where(keep, scores, float("-inf"))
// lse is per query: a column vector of the transposed scores; -inf (a query with no kept key)
// turns into +inf so that p = 0 rather than NaN.
// CHECK-NEXT:             # tile.recompute_probs: p = exp(s - lse); a row with no kept key (lse = -inf) gives 0
// CHECK-NEXT:             lse_safe_1 = tl.where(lse == float("-inf"), float("inf"), lse)
// CHECK-NEXT:             probs = tl.math.exp2(scores_1 * (sm_scale * 1.4426950408889634) - (lse_safe_1 * 1.4426950408889634)[None, :])
// CHECK-NEXT:             # tile.dot_transposed: a @ b^T, fp32 accumulation
// CHECK-NEXT:             grad_probs = tl.dot(v, tl.trans(grad_out))
// CHECK-NEXT:             # tile.softmax_grad: dS = P * (dP - delta)
// CHECK-NEXT:             grad_scores = probs * (grad_probs - delta[None, :])
// CHECK-NEXT:             # tile.accumulate: acc + p @ v
// CHECK-NEXT:             dv = tl.dot(probs.to(grad_out.dtype), grad_out, acc=dv)
// CHECK-NEXT:             # tile.accumulate: acc + p @ v
// CHECK-NEXT:             dk = tl.dot(grad_scores.to(q.dtype), q, acc=dk)

// The full query blocks: no bounds checks, no mask.
// CHECK-NEXT:     # tile.q_loop over full query blocks: no mask work, for each query head of this key/value head
// CHECK-NEXT:     for head_in_group in range(0, group_size):
// CHECK-NEXT:         head = kv_head * group_size + head_in_group
// CHECK:              for start_m in range(full_start, full_end, BLOCK_N):
// CHECK-NEXT:             start_m = tl.multiple_of(start_m, BLOCK_N)
// CHECK-NEXT:             queries = start_m + tl.arange(0, BLOCK_N)
// CHECK-NEXT:             q_pos = queries + (n_k - n_q)
// CHECK-NEXT:             # tile.load: q_rot rows (loop), all columns
// CHECK-NEXT:             q_1 = tl.load(q_rot_base + queries[:, None] * stride_q_rot_n + (cols_d)[None, :] * stride_q_rot_d)
// CHECK-NOT:              tl.where(keep
// CHECK:                  lse_safe_2 = tl.where(lse_1 == float("-inf"), float("inf"), lse_1)
// CHECK-NOT:              tl.where(keep
// CHECK:                  dk = tl.dot(grad_scores_1.to(q_1.dtype), q_1, acc=dk)

// The ragged tail of the query range: masked again.
// CHECK-NEXT:     # tile.q_loop over partial query blocks: masked and bounds-checked, for each query head of this key/value head
// CHECK-NEXT:     for head_in_group in range(0, group_size):
// CHECK-NEXT:         head = kv_head * group_size + head_in_group
// CHECK:              for start_m in range(full_end, q_end, BLOCK_N):
// CHECK:                  keep_1 = query_in_bounds[None, :] & row_in_bounds[:, None] & (rows[:, None] <= q_pos[None, :])
// CHECK:                  dk = tl.dot(grad_scores_2.to(q_2.dtype), q_2, acc=dk)

// dK: scaled once, split from full width into the halves of the rotary pairs, rotated back at
// key positions (sin negated: the transpose), stored; dV is stored as accumulated.
// CHECK-NEXT:     # tile.apply_scale: times the score scale (sm_scale)
// CHECK-NEXT:     dk_1 = dk * sm_scale
// CHECK-NEXT:     # tile.split: full width into the halves of the rotary pairs, once per program
// CHECK-NEXT:     dk_lo, dk_hi = tl.split(tl.permute(tl.reshape(dk_1, (BLOCK_M, 2, BLOCK_HALF)), (0, 2, 1)))
// CHECK-NEXT:     # tile.rotate: RoPE at key positions, in fp32, pairs (dk_lo, dk_hi)
// CHECK-NEXT:     table_rows = rows
// CHECK-NEXT:     cos = tl.load(
// CHECK-NEXT:     sin = tl.load(
// CHECK-NEXT:     sin = sin * -1.0
// CHECK:          dk_lo_1 = (dk_lo_f32 * cos - dk_hi_f32 * sin).to(dk_lo.dtype)
// CHECK-NEXT:     dk_hi_1 = (dk_lo_f32 * sin + dk_hi_f32 * cos).to(dk_hi.dtype)
// CHECK-NEXT:     # tile.store: dk rows (program), first halves of the rotary pairs
// CHECK-NEXT:     tl.store(dk_base + rows[:, None] * stride_dk_n + (cols_half)[None, :] * stride_dk_d, dk_lo_1.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK-NEXT:     # tile.store: dk rows (program), second halves of the rotary pairs
// CHECK-NEXT:     tl.store(dk_base + rows[:, None] * stride_dk_n + (ROT_HALF + cols_half)[None, :] * stride_dk_d, dk_hi_1.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK-NEXT:     # tile.store: dv rows (program), all columns
// CHECK-NEXT:     tl.store(dv_base + rows[:, None] * stride_dv_n + (cols_dv)[None, :] * stride_dv_d, dv.to(dv_ptr.dtype.element_ty), mask=row_in_bounds[:, None])

// dQ: query blocks in reverse order (under a causal mask the last blocks have the most keys).
// CHECK-LABEL: def attention_bwd_dq(
// CHECK:          # Program grid (one program per (batch x query head, query block)).
// CHECK-NEXT:     block_id = tl.num_programs(1) - 1 - tl.program_id(1)
// CHECK-NEXT:     batch_head = tl.program_id(0)
// CHECK-NEXT:     batch = (batch_head // num_heads).to(tl.int64)
// CHECK-NEXT:     head = (batch_head % num_heads).to(tl.int64)
// CHECK-NEXT:     kv_head = head // group_size  # GQA/MQA: query heads share a key/value head
// CHECK-NOT:      head_in_group
// lse is per query: a row vector here.
// CHECK-NOT:      scores * sm_scale
// CHECK:          probs = tl.math.exp2(scores * (sm_scale * 1.4426950408889634) - (lse_safe_1 * 1.4426950408889634)[:, None])
// CHECK:          grad_scores = probs * (grad_probs - delta[:, None])
// CHECK:          dq = tl.dot(grad_scores.to(k.dtype), k, acc=dq)
// CHECK:          dq_lo, dq_hi = tl.split(tl.permute(tl.reshape(dq_1, (BLOCK_M, 2, BLOCK_HALF)), (0, 2, 1)))
// CHECK-NEXT:     # tile.rotate: RoPE at query positions, in fp32, pairs (dq_lo, dq_hi)
// CHECK-NEXT:     table_rows = tl.abs(q_pos)
// CHECK:          sin = sin * tl.where(q_pos < 0, -1.0, 1.0)[:, None] * -1.0

// bwd-rope=as_forward: the loop's query rows are rotated in registers at their own positions
// (bounds-checked in the partial blocks); dK accumulates per half and is never split.
// ASFWD:          def attention_bwd_dkdv(
// ASFWD-NEXT:         q_ptr, stride_q_b, stride_q_h, stride_q_n, stride_q_d,
// q is loaded in rotary halves here, not full width: no shared offsets.
// ASFWD-NOT:          SHARED_OFFSETS
// ASFWD:              kv_head = head  # programs of a key_blocks grid own a key/value head
// ASFWD:              k_lo_rot = (k_lo_f32 * cos - k_hi_f32 * sin).to(k_lo.dtype)
// ASFWD:              dk_lo = tl.zeros([BLOCK_M, BLOCK_HALF], dtype=tl.float32)
// ASFWD:              for head_in_group in range(0, group_size):
// ASFWD-NEXT:             head = kv_head * group_size + head_in_group
// ASFWD:                  queries = start_m + tl.arange(0, BLOCK_N)
// ASFWD-NEXT:             query_in_bounds = queries < n_q
// ASFWD-NEXT:             q_pos = queries + (n_k - n_q)
// ASFWD:                  # tile.rotate: RoPE at query positions, in fp32, pairs (q_lo, q_hi)
// ASFWD-NEXT:             table_rows_1 = tl.abs(q_pos)
// ASFWD-NEXT:             cos_1 = tl.load(rope_table_ptr + table_rows_1[:, None] * stride_rope_table_n + cols_half[None, :] * stride_rope_table_d, mask=query_in_bounds[:, None], other=1.0)
// ASFWD:                  scores = tl.dot(k_lo_rot, tl.trans(q_lo_rot))
// ASFWD-NEXT:             scores = tl.dot(k_hi_rot, tl.trans(q_hi_rot), acc=scores)
// ASFWD:                  dk_lo = tl.dot(grad_scores.to(q_lo_rot.dtype), q_lo_rot, acc=dk_lo)
// ASFWD-NEXT:             # tile.accumulate: acc + p @ v
// ASFWD-NEXT:             dk_hi = tl.dot(grad_scores.to(q_hi_rot.dtype), q_hi_rot, acc=dk_hi)
// ASFWD-NOT:          tl.split
// ASFWD:              # tile.rotate: RoPE at key positions, in fp32, pairs (dk_lo_1, dk_hi_1)
// ASFWD-NEXT:         table_rows_4 = rows
// ASFWD-NOT:          tl.split
// ASFWD:          def attention_bwd_dq(
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
