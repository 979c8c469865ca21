// RUN: attnfuse-opt %s -p place-rope | filecheck %s --check-prefix=AUTO-SHORT
// RUN: attnfuse-opt %s -p 'place-rope{seq-len-q=16384 seq-len-k=16384 batch-heads=32}' | filecheck %s --check-prefix=AUTO-LONG
// RUN: attnfuse-opt %s -p 'place-rope{seq-len-q=64 seq-len-k=64}' | filecheck %s --check-prefix=AUTO-TINY
// RUN: attnfuse-opt %s -p 'place-rope{query=pre_rotated key=fused}' | filecheck %s --check-prefix=FORCED
// RUN: attnfuse-opt %s -p 'place-rope{query=pre_rotated},place-rope{query=fused key=fused}' | filecheck %s --check-prefix=REPLACED

// The query rotation is fused under auto (once per element either way) up to long query
// lengths, where measurement says pre-rotating it too is faster (see rotation_calculus.py).
// The key rotation is recomputed by every query block when fused, so auto pre-rotates it
// unless the problem has few query blocks.
// AUTO-SHORT: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.query
// AUTO-SHORT: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.key
// AUTO-LONG: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.query
// AUTO-LONG: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.key
// AUTO-TINY: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.query
// AUTO-TINY: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.key
// FORCED: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.query
// FORCED: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.key
// REPLACED: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.query
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
