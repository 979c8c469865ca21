"""A block file that raises an exception of its own deriving from BaseException, not Exception,
while imported: attnfuse-opt still reports one line (test/lit/tools/out-of-tree-block.mlir)."""


class NotAnException(BaseException):
    """Outside the Exception hierarchy, as KeyboardInterrupt and SystemExit are."""


raise NotAnException("this module refuses to load")
