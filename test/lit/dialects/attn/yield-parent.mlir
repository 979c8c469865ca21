// RUN: attnfuse-opt %s --allow-unregistered-dialect --verify-diagnostics | filecheck %s
// attn.yield only terminates an attn.variant.

%x = "test.op"() : () -> !attn.output
attn.yield %x
// CHECK: 'attn.yield' expects parent op 'attn.variant'
