// attnfuse-opt reads MLIR text from a file of any name, or from stdin (no file, or `-`), and
// offers only the targets that print AttnFuse IR (xDSL's others printed nothing, exit 0).
// (No `cat` here: lit's builtin cat leaves PYTHONPATH pointing at lit for the later lines.)
// RUN: attnfuse-opt - < %s | filecheck %s
// RUN: attnfuse-opt < %s | filecheck %s
// RUN: cp %s %t.txt && attnfuse-opt %t.txt | filecheck %s
// RUN: attnfuse-opt %s -t mlir | filecheck %s
// RUN: not attnfuse-opt %s -t wgsl 2>&1 | filecheck %s --check-prefix=TARGET
// RUN: not attnfuse-opt - < %S/../inputs/typo.mlir 2>&1 | filecheck %s --check-prefix=STDIN-ERROR

// CHECK: attn.variant @attention
// CHECK-NEXT: attn.scores %q, %k
// TARGET: error: argument -t/--target: invalid choice: 'wgsl' (choose from mlir, triton, gluon)
// STDIN-ERROR: stdin:4:22: error: Operation attn.scorez is not registered
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
