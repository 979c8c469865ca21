// RUN: not attnfuse-opt %s -p canonicalize-attn 2>&1 | filecheck %s
// ALiBi's slopes are used in fp32: each must be a finite fp32 number.

attn.variant @nan_slope(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = [0x7FF8000000000000 : f64, 1.0 : f64]}
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: invalid-alibi.mlir:6:3: error: alibi slopes must be finite fp32 numbers, got nan
