// Option mistakes are the command line's, reported at the option (never at the input's first line,
// never as an internal error): a target's options, and pass options out of range.
// RUN: not attnfuse-opt %s -t 'triton{foo=1}' 2>&1 | filecheck %s --check-prefix=TARGET-OPTION
// RUN: not attnfuse-opt %s -t 'triton{interpreter=maybe}' 2>&1 | filecheck %s --check-prefix=TARGET-VALUE
// RUN: not attnfuse-opt %s -t 'triton{interpreter=true' 2>&1 | filecheck %s --check-prefix=TARGET-SYNTAX
// RUN: not attnfuse-opt %s -p 'lower-to-tile{num-warps=3}' 2>&1 | filecheck %s --check-prefix=WARPS
// RUN: not attnfuse-opt %s -p 'place-rope{block-m=0}' 2>&1 | filecheck %s --check-prefix=ROPE-BLOCK
// RUN: not attnfuse-opt %s -p 'place-rope{seq-len-q=-5}' 2>&1 | filecheck %s --check-prefix=ROPE-SEQ
// RUN: not attnfuse-opt %s 2>&1 -p 'lower-to-tile{block-m=1048576}' | filecheck %s --check-prefix=BLOCK-MAX
// RUN: not attnfuse-opt %s 2>&1 -p 'lower-to-tile{head-dim=true}' | filecheck %s --check-prefix=BOOL-INT
// RUN: not attnfuse-opt %s 2>&1 -p 'warp-specialize{consumers=false}' | filecheck %s --check-prefix=BOOL-INT2
// RUN: not attnfuse-opt %s 2>&1 -p 'analyze-masks,convert-attn-to-tile{block-n=24}' | filecheck %s --check-prefix=ALIAS
// RUN: not attnfuse-opt %s 2>&1 -p 'lower-to-tile{element-type=f8}' | filecheck %s --check-prefix=QUOTED
// RUN: not attnfuse-opt %s 2>&1 -p 'analyze-masks,lower-to-tile{bwd-rope=as}' | filecheck %s --check-prefix=QUOTED-LATER
// RUN: attnfuse-opt %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t=triton | filecheck %s --check-prefix=EQUALS
// EQUALS:        def attention_fwd(

// TARGET-OPTION: attnfuse-opt: error: -t triton{foo=1}: Provided arguments ["foo"] not found in expected arguments ["interpreter"]
// TARGET-VALUE:  attnfuse-opt: error: -t triton{interpreter=maybe}: Incompatible types
// TARGET-SYNTAX: attnfuse-opt: error: -t triton{interpreter=true: column 24: Malformed pass arguments
// WARPS:         <pass-pipeline>:1:15: error: lower-to-tile: num-warps must be one of 1, 2, 4, 8, 16, got 3
// ROPE-BLOCK:    <pass-pipeline>:1:12: error: place-rope: block-m must be >= 1, got 0
// ROPE-SEQ:      <pass-pipeline>:1:12: error: place-rope: seq-len-q must be >= 1, got -5
// BLOCK-MAX:     <pass-pipeline>:1:15: error: lower-to-tile: block-m must be a power of two in [16, 1024], got 1048576
// A bool is an int to Python (and to xDSL's option parser): refused for a number option.
// BOOL-INT:      <pass-pipeline>:1:15: error: lower-to-tile: head-dim must be a number, got true
// BOOL-INT2:     <pass-pipeline>:1:17: error: warp-specialize: consumers must be a number, got false
// An alias's option is named under the name it was invoked by, and found there.
// ALIAS:         <pass-pipeline>:1:36: error: convert-attn-to-tile: block-n must be a power of two in [16, 1024], got 24
// A text value is quoted, and the diagnostic points at it.
// QUOTED:        <pass-pipeline>:1:28: error: lower-to-tile: element-type must be f16, bf16 or f32, got 'f8'
// The value after its option, not the same text earlier in another pass's name ("masks").
// QUOTED-LATER:  <pass-pipeline>:1:38: error: lower-to-tile: bwd-rope must be pre_rotated or as_forward, got 'as'
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
