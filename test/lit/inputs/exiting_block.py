"""A block author's mistake for tools/out-of-tree-block.mlir: a module that exits while it is
imported (a script's `sys.exit`), which is a module that does not load, not the tool's exit."""

import sys

sys.exit("this module is a script")
