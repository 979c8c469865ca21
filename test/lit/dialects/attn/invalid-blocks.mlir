// RUN: not attnfuse-opt %s -p canonicalize-attn 2>&1 | filecheck %s
// The blocks' verifiers, as located attnfuse-opt diagnostics: parameters must be usable in fp32.

attn.variant @cap(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 0.0 : f64}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: invalid-blocks.mlir:6:3: error: softcap cap must lie in [1.18e-38, 3.4e+38] (kernels divide by it in fp32), got 0.0
