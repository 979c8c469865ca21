// RUN: attnfuse-opt %s -p place-rope | filecheck %s --check-prefix=AUTO-SHORT
// RUN: attnfuse-opt %s -p 'place-rope{seq-len-q=16384 seq-len-k=16384 batch-heads=32}' | filecheck %s --check-prefix=AUTO-LONG
// RUN: attnfuse-opt %s -p 'place-rope{seq-len-q=64 seq-len-k=64}' | filecheck %s --check-prefix=AUTO-TINY
// RUN: attnfuse-opt %s -p 'place-rope{query=pre_rotated key=fused}' | filecheck %s --check-prefix=FORCED
// RUN: attnfuse-opt %s -p 'place-rope{query=pre_rotated},place-rope{query=fused key=fused}' | filecheck %s --check-prefix=REPLACED
// RUN: attnfuse-opt %s -p 'place-rope{key=given}' | filecheck %s --check-prefix=GIVEN
// RUN: attnfuse-opt %s -p 'place-rope{key=given},place-rope{key=fused},place-rope{key=pre_rotated},place-rope' | filecheck %s --check-prefix=GIVEN
// RUN: attnfuse-opt %S/../inputs/given-key.mlir -p 'place-rope{query=pre_rotated key=fused}' | filecheck %s --check-prefix=GIVEN-IR
// RUN: not attnfuse-opt %s -p 'place-rope{query=given}' 2>&1 | filecheck %s --check-prefix=GIVEN-QUERY

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
// key=given: the caller passes the key rotated (a KV cache). That is what the key input
// means, not a choice: no later run, forced or auto, overwrites it; the query is placed as
// usual (fused under auto: the given key is read as it is, like a pre-rotated one).
// GIVEN: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement fused>} : !attn.query
// GIVEN: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement given>} : !attn.key
// A program written with a given key keeps it whatever the options ask of the key.
// GIVEN-IR: attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.query
// GIVEN-IR: attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement given>} : !attn.key
// GIVEN-QUERY: <pass-pipeline>:1:12: error: place-rope: query=given is not a placement: only keys arrive rotated (from a KV cache); the query is rotated by the kernels
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
