// RUN: attnfuse-opt %S/../inputs/given-key.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' | filecheck %s --check-prefix=AUTO
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=given},lower-to-tile{head-dim=64 bwd-rope=as_forward},fold-scale-into-exp,share-offsets' | filecheck %s --check-prefix=FUSED

// A key rotation placed `given`: the caller passes k already rotated (a KV cache's keys). No
// kernel rotates k, neither a rotate_key kernel nor a tile.rotate at key positions, and dK is
// stored without the rotation's transpose (it is the gradient of the k passed). The query is
// rotated as usual, dQ gets R^T.

// AUTO-NOT:   tile.kernel @rotate_key
// AUTO:       tile.kernel @rotate_query
// AUTO:       tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>
// AUTO:         tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>}
// AUTO-NEXT:    %q_rot = tile.join %q_lo_rot, %q_hi_rot {pairs = #tile<pairs half>}
// AUTO:         %k_1 = tile.load %k[loop, all]
// AUTO-NEXT:    tile.scores(%q_rot) x(%k_1)
// AUTO:       tile.kernel @attention_bwd_dq_delta(%q_rot: !tile.tensor<q_rot>, %k: !tile.tensor<k>,
// AUTO:         tile.rotate %dq_lo, %dq_hi, %rope_table {positions = #tile<seq query>, inverse}
// AUTO:       tile.kernel @attention_bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k: !tile.tensor<k>,
// AUTO-NEXT:    %k_1 = tile.load %k[program, all]
// AUTO:         %dk_11 = tile.apply_scale %dk_8
// AUTO-NEXT:    tile.store %dk_11, %dk[program, all]
// AUTO-NOT:   positions = #tile<seq key>

// In-loop rotations everywhere (bwd-rope=as_forward), interleaved, partial width: q is
// rotated in every kernel that loads it, k is loaded in the same column parts but never rotated.
// FUSED-NOT:  tile.kernel @rotate_
// FUSED:      tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>
// FUSED:        tile.rotate %q_even, %q_odd, %rope_table {positions = #tile<seq query>}
// FUSED:        %k_even = tile.load %k[loop, even]
// FUSED-NEXT:   %k_odd = tile.load %k[loop, odd]
// FUSED-NEXT:   %k_pass = tile.load %k[loop, pass]
// FUSED-NEXT:   tile.scores(%q_even_rot, %q_odd_rot, %q_pass) x(%k_even, %k_odd, %k_pass)
// FUSED:      tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// FUSED:        tile.rotate %q_even, %q_odd, %rope_table {positions = #tile<seq query>}
// FUSED:        tile.store %dk_even_10, %dk[program, even]
// FUSED-NEXT:   tile.store %dk_odd_10, %dk[program, odd]
// FUSED-NEXT:   tile.store %dk_pass_10, %dk[program, pass]
// FUSED-NOT:  positions = #tile<seq key>
attn.variant @interleaved(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, interleaved} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
