// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{element-type=bf16}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{element-type=f32}' | filecheck %s --check-prefix=F32
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{element-type=bf16},fold-scale-into-exp,share-offsets' -t triton | filecheck %s --check-prefix=TRITON

// ReLU attention with RoPE in bf16: relu's derivative jumps at s = 0, so the backward forms
// its scores from unrounded rotated q and k. Whatever the placement, its kernels read the raw
// q and k widened to f32 and rotate them in registers (a pre-rotated copy would already be
// rounded to bf16); the forward keeps its placement (it reads the pre-rotated copies, which
// only it needs now). The scores of widened operands are formed far more exactly than bf16
// products (about 2^-16 |q| |k|).
// CHECK:       tile.kernel @rotate_query(
// CHECK:       tile.kernel @rotate_key(
// CHECK:       tile.kernel @attention_fwd(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>,
// CHECK:       tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// CHECK:         %k_lo = tile.load %k[program, half_lo] : !tile.tensor<k> -> !tile.tile<m x half x f32>
// CHECK-NEXT:    %k_hi = tile.load %k[program, half_hi] : !tile.tensor<k> -> !tile.tile<m x half x f32>
// CHECK-NEXT:    %k_lo_rot, %k_hi_rot = tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>} : !tile.tile<m x half x f32>
// CHECK:           %q_lo = tile.load %q[loop, half_lo] : !tile.tensor<q> -> !tile.tile<n x half x f32>
// CHECK:           %scores = tile.scores(%k_lo_rot, %k_hi_rot) x(%q_lo_rot, %q_hi_rot) : (!tile.tile<m x half x f32>, !tile.tile<m x half x f32>) x(!tile.tile<n x half x f32>, !tile.tile<n x half x f32>)
// CHECK:           tile.relu_grad
// CHECK:       tile.kernel @attention_bwd_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// CHECK:         %q_lo = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f32>
// CHECK:           %k_lo = tile.load %k[loop, half_lo] : !tile.tensor<k> -> !tile.tile<n x half x f32>

// In f32 nothing is rounded: the backward reads the pre-rotated copies like softmax's.
// F32:         tile.kernel @attention_bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>,

// The printed kernels: widened loads, and for the widened scores each operand split into a
// bf16 head and the bf16 rounding of its remainder, summed as three bf16 products per part
// (rest x head, head x rest, head x head; about 2^-16 relative). The other products round the
// widened operand to bf16.
// TRITON-LABEL: def attention_bwd_dkdv(
// TRITON:         k_lo = tl.load({{.*}}).to(tl.float32)
// TRITON:           q_lo = tl.load({{.*}}).to(tl.float32)
// TRITON:           k_lo_rot_head = k_lo_rot.to(tl.bfloat16)
// TRITON-NEXT:      k_lo_rot_rest = (k_lo_rot - k_lo_rot_head.to(tl.float32)).to(tl.bfloat16)
// TRITON-NEXT:      q_lo_rot_head = q_lo_rot.to(tl.bfloat16)
// TRITON-NEXT:      q_lo_rot_rest = (q_lo_rot - q_lo_rot_head.to(tl.float32)).to(tl.bfloat16)
// TRITON:           scores = tl.dot(k_lo_rot_rest, tl.trans(q_lo_rot_head))
// TRITON-NEXT:      scores = tl.dot(k_lo_rot_head, tl.trans(q_lo_rot_rest), acc=scores)
// TRITON-NEXT:      scores = tl.dot(k_lo_rot_head, tl.trans(q_lo_rot_head), acc=scores)
// TRITON-NEXT:      scores = tl.dot(k_hi_rot_rest, tl.trans(q_hi_rot_head), acc=scores)
// TRITON-NEXT:      scores = tl.dot(k_hi_rot_head, tl.trans(q_hi_rot_rest), acc=scores)
// TRITON-NEXT:      scores = tl.dot(k_hi_rot_head, tl.trans(q_hi_rot_head), acc=scores)
// TRITON:           grad_probs = tl.dot(v, tl.trans(grad_out))
// TRITON:           dk_lo = tl.dot(grad_scores.to(tl.bfloat16), q_lo_rot.to(tl.bfloat16), acc=dk_lo)
// TRITON-LABEL: def attention_bwd_dq(
// TRITON:           scores = tl.dot(q_lo_rot_rest, tl.trans(k_lo_rot_head))
attn.variant @relu_rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 5.000000e+05 : f64} : !attn.query
  %kr = attn.rope %k {theta = 5.000000e+05 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Softmax is smooth: its bf16 backward reads the rounded pre-rotated copies as usual.
// CHECK:       tile.kernel @attention_bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>,
// CHECK-NOT:     tile.load %{{[qk]}}_rot{{.*}}x f32>
// CHECK:       tile.kernel @attention_bwd_dq(%q_rot: !tile.tensor<q_rot>,
// CHECK-NOT:     tile.load %{{[qk]}}_rot{{.*}}x f32>
// CHECK:       {{^}}}
// TRITON-LABEL: def attention_bwd_dkdv(
// TRITON-NOT:     _rest
// TRITON-LABEL: def attention_bwd_dq(
// TRITON-NOT:     _rest
// TRITON:       {{^}}//{{ }}-----
attn.variant @softmax_rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 5.000000e+05 : f64} : !attn.query
  %kr = attn.rope %k {theta = 5.000000e+05 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// A rotation of q alone (legal in the IR; the DSL rotates both): k is widened too, since a
// score's parts share one element type.
// CHECK:       tile.kernel @attention_bwd_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// CHECK:         %q_lo = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f32>
// CHECK:           %k_lo = tile.load %k[loop, half_lo] : !tile.tensor<k> -> !tile.tile<n x half x f32>
// CHECK-NOT:       tile.rotate {{.*}}positions = #tile<seq key>
// CHECK:           tile.scores
// The unrotated k is bf16 data widened, exact in its bf16 head: its remainder products (all
// zero) are not emitted, two products per part instead of three.
// TRITON-LABEL: def attention_bwd_dq(
// TRITON:         q_lo_rot_head = q_lo_rot.to(tl.bfloat16)
// TRITON-NEXT:    q_lo_rot_rest = (q_lo_rot - q_lo_rot_head.to(tl.float32)).to(tl.bfloat16)
// TRITON-NEXT:    k_lo_head = k_lo.to(tl.bfloat16)
// TRITON-NOT:     k_lo_rest
// TRITON:         scores = tl.dot(q_lo_rot_rest, tl.trans(k_lo_head))
// TRITON-NEXT:    scores = tl.dot(q_lo_rot_head, tl.trans(k_lo_head), acc=scores)
// TRITON-NEXT:    scores = tl.dot(q_hi_rot_rest, tl.trans(k_hi_head), acc=scores)
// TRITON-NEXT:    scores = tl.dot(q_hi_rot_head, tl.trans(k_hi_head), acc=scores)
// TRITON-NEXT:    scores = scores * sm_scale
attn.variant @relu_rope_query_only(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
