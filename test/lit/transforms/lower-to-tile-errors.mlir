// RUN: not attnfuse-opt %s -p lower-to-tile 2>&1 | filecheck %s --check-prefix=NO-PLACEMENT
// RUN: not attnfuse-opt %s -p 'place-rope,lower-to-tile' 2>&1 | filecheck %s --check-prefix=NO-BAND
// RUN: not attnfuse-opt %s -p 'place-rope,analyze-masks,lower-to-tile{head-dim=16}' 2>&1 | filecheck %s --check-prefix=ROTARY
// RUN: not attnfuse-opt %s -p 'lower-to-tile{block-m=24}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not attnfuse-opt %s -p 'lower-to-tile{element-type=f64}' 2>&1 | filecheck %s --check-prefix=ELEMENT

// lower-to-tile needs the earlier passes' annotations, and says which pass is missing.
// NO-PLACEMENT: lower-to-tile-errors.mlir:[[# @LINE + 6]]:3: error: lower-to-tile: rotation has no placement; run place-rope first
// NO-BAND: lower-to-tile-errors.mlir:[[# @LINE + 8]]:3: error: lower-to-tile: mask has no band; run analyze-masks first
// ROTARY: lower-to-tile-errors.mlir:[[# @LINE + 3]]:1: error: lower-to-tile: rotary_dim 32 exceeds head-dim 16
// OPTION: <pass-pipeline>:1:15: error: lower-to-tile: block-m must be a power of two in [16, 1024], got 24
// ELEMENT: <pass-pipeline>:1:28: error: lower-to-tile: element-type must be f16, bf16 or f32, got 'f64'
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----
// RUN: not attnfuse-opt %S/../inputs/sparse.mlir -p 'analyze-masks,lower-to-tile{block-m=64}' 2>&1 | filecheck %s --check-prefix=SPARSE
// SPARSE: sparse.mlir:3:1: error: lower-to-tile: block-m (64) and block-n (64) must not exceed the block_sparse block size (32)

// -----
// A rotation over the whole head (no rotary_dim) pairs every dim: an odd head dim would be left
// out of the pairs and of the scores, so it is refused, fused or pre-rotated, halves or interleaved.
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{head-dim=3 backward=false}' -t triton 2>&1 | filecheck %s --check-prefix=ODD
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=63}' 2>&1 | filecheck %s --check-prefix=ODD
// ODD-NOT: def attention_fwd
// ODD: rope.mlir:3:1: error: lower-to-tile: the rotation covers the whole head (no rotary_dim), and head-dim {{[0-9]+}} is odd: give an even rotary_dim
// ODD-NOT: def attention_fwd
