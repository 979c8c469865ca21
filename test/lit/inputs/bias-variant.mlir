// A variant with an additive bias (whose gradient the separate backward's dQ-bias kernel writes).
attn.variant @bias(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}
