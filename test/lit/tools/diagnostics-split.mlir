// RUN: not attnfuse-opt %S/../inputs/split-errors.mlir --split-input-file 2>&1 | filecheck %s
// RUN: not attnfuse-opt %S/../inputs/split-errors.mlir --split-input-file 2>/dev/null | filecheck %s --check-prefix=OUT
// With --split-input-file every chunk runs, as with mlir-opt: each failing chunk is one located
// line (a value never defined is located at its use, not at the end of the input), the others
// are printed, and the exit code is 1.
// CHECK:     split-errors.mlir:4:24: error: %zz is used but never defined
// CHECK:     split-errors.mlir:23:36: error: window size must be positive, got 0
// CHECK-NOT: Traceback
// OUT:       // -----
// OUT:       attn.variant @second(
// OUT:       // -----
// OUT-NOT:   attn.variant
