// Input for tools/diagnostics.mlir: parses, but is not a well-formed attention (two
// normalizers).
builtin.module {
  attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
    %s = attn.scores %q, %k
    %p = attn.softmax %s
    %p2 = attn.softmax %s
    %o = attn.pv %p, %v
    attn.yield %o
  }
}
