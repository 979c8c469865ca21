"""A block author's mistake for tools/out-of-tree-block.mlir: a module with no `OPS`."""
