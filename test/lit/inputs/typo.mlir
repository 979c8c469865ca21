// Input for tools/diagnostics.mlir: a misspelled op.
builtin.module {
  attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
    %s = attn.scorez %q, %k
  }
}
