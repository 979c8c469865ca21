"""A block module split over two files for tools/out-of-tree-sibling-import.mlir: its op is
defined in `no_vjp_block.py` beside it and imported by the plain module name, as `python FILE`
would find it (`--block-module` puts the file's directory on the import path)."""

from no_vjp_block import SquareScoresOp

OPS = (SquareScoresOp,)
