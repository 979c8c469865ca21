// Hand-written IR for test/lit/tools/out-of-tree-elementwise-filter.mlir and
// test_elementwise_filter.py: two sink_window filters on the chain and one whose result
// nothing reads (the op parses with sink_window_block.py, beside this file, registered).
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %w1 = attn.sink_window %s {sinks = 4 : i64, window = 256 : i64}
  %unused = attn.sink_window %s {sinks = 2 : i64, window = 77 : i64}
  %w2 = attn.sink_window %w1 {sinks = 1 : i64, window = 8 : i64}
  %p = attn.softmax %w2
  %o = attn.pv %p, %v
  attn.yield %o
}
