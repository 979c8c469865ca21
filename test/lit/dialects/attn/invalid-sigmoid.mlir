// RUN: not attnfuse-opt %s -p canonicalize-attn 2>&1 | filecheck %s
// sigmoid's bias is used in fp32: it must be a finite fp32 number.

attn.variant @bias(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.sigmoid %s {bias = 1.0e+39 : f64}
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: error: sigmoid bias must be a finite fp32 number (|bias| <= 3.4e+38), got 1e+39
