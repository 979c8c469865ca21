// A block author's mistakes found while a pass lowers the block are reported at the block's op
// in the input, never at the variant or the file's first line: a tile.map body no target prints
// (built by the op's lower()), and a non-additive modifier without a vjp() lowered with the
// backward, after canonicalize-attn has moved it above the mask (the op moves, not a copy).
// RUN: not attnfuse-opt --block-module %S/../inputs/bad_map_body_block.py --block-module %S/../inputs/no_vjp_block.py --split-input-file %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile 2>&1 | filecheck %s

// CHECK: {{.*}}out-of-tree-lowering-errors.mlir:[[# @LINE + 3]]:3: error: 'attn.sine_keep': its interface's lower() built an invalid tile op: tile.map bodies hold only {{.*}}; got math.sin
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %kept = attn.sine_keep %s
  %p = attn.softmax %kept
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// CHECK: {{.*}}out-of-tree-lowering-errors.mlir:[[# @LINE + 4]]:3: error: 'attn.square_scores' is not additive {{.*}} must define vjp() for the backward
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %sq = attn.square_scores %m
  %p = attn.softmax %sq
  %o = attn.pv %p, %v
  attn.yield %o
}
