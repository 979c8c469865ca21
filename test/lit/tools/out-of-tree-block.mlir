// RUN: attnfuse-opt --block-module %S/../../python/blocks/score_offset_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t triton | filecheck %s
// RUN: attnfuse-opt --block-module=%S/../../python/blocks/score_offset_block.py %s -p canonicalize-attn | filecheck %s --check-prefix=IR
// RUN: not attnfuse-opt %s 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not attnfuse-opt --block-module %S/no-such-block.py %s 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not attnfuse-opt --block-module %S/../inputs/no_vjp_block.py %s 2>&1 | filecheck %s --check-prefix=OTHER
// RUN: not attnfuse-opt --block-module %S/../inputs/no_role_block.py %s 2>&1 | filecheck %s --check-prefix=NOROLE
// RUN: not attnfuse-opt --block-module %S/../inputs/no_ops_block.py %s 2>&1 | filecheck %s --check-prefix=NOOPS
// RUN: not attnfuse-opt --block-module %S/../inputs/exiting_block.py %s 2>&1 | filecheck %s --check-prefix=EXITS
// RUN: not attnfuse-opt --block-module %S/../inputs/base_exception_block.py %s 2>&1 | filecheck %s --check-prefix=BASE
// A block defined outside the package (docs/architecture.md §10.1: score_offset, in one file
// beside its pytest tests) reaches the CLI with --block-module: its op parses, canonicalize-attn
// orders it by its own algebra (additive, after ALiBi), and the printed kernels apply it.

// CHECK-NOT:  Traceback
// CHECK:      def attention_fwd(
// CHECK:      + 0.75
// IR:         attn.alibi
// IR-NEXT:    attn.score_offset {{.*}} {offset = 7.500000e-01 : f64}
// UNKNOWN:    out-of-tree-block.mlir:[[# @LINE + 15]]:{{[0-9]+}}: error: Operation attn.score_offset is not registered (if it is the op of a block defined outside the package: load its file with --block-module FILE)
// With another module loaded, the error names the ops the registered modules define, closest first.
// OTHER:      error: Operation attn.score_offset is not registered (the registered block modules define 1 op(s); closest: attn.square_scores; if it is the op of another block defined outside the package: load its file with --block-module FILE)
// MISSING:    attnfuse-opt: error: --block-module {{.*}}no-such-block.py: no such file
// An op with none of the three interfaces is refused where it stands; a module without OPS at once.
// NOROLE:     out-of-tree-block.mlir:[[# @LINE + 10]]:3: error: 'attn.score_offset' inside attn.variant implements none of ScoreModifier, KeyFilter and Normalizer
// NOOPS:      attnfuse-opt: error: --block-module {{.*}}no_ops_block.py: the module defines no OPS: a block module lists its ops in OPS
// EXITS-NOT:  Traceback
// EXITS:      attnfuse-opt: error: --block-module {{.*}}exiting_block.py: the module called sys.exit('this module is a script') while being imported
// BASE-NOT:   Traceback
// BASE:       attnfuse-opt: error: --block-module {{.*}}base_exception_block.py: NotAnException: this module refuses to load
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %a = attn.alibi %m
  %o1 = attn.score_offset %a {offset = 7.500000e-01 : f64}
  %p = attn.relu %o1
  %o = attn.pv %p, %v
  attn.yield %o
}
