"""The one exception type users see.

Every composition error, bad argument and malformed program raises `AttnFuseError` (or a
subclass) with a message that names the block, argument or IR location at fault.
"""


class AttnFuseError(ValueError):
    """A user error: a bad composition, argument, tensor or IR program.

    Subclasses `ValueError` so that generic callers that already catch bad-value errors keep
    working; AttnFuse code never raises a bare `ValueError` for user mistakes.
    """


class CompositionError(AttnFuseError):
    """Blocks that cannot be combined, or a block parameter out of range."""


class ArgumentError(AttnFuseError):
    """A call-time tensor or keyword argument that does not fit the compiled variant."""


class IRError(AttnFuseError):
    """A program the compiler cannot handle; `op` is the operation at fault, if known, so that
    tools can point at its source location."""

    def __init__(self, message: str, op: object | None = None):
        super().__init__(message)
        self.op = op


class PassOptionError(AttnFuseError):
    """A pass pipeline option out of range (e.g. `lower-to-tile{block-m=24}`): `pass_name`
    and `option` say where (`attnfuse-opt` points at the option in its `-p` argument), the
    message is `"<pass>: <problem>"`."""

    def __init__(self, pass_name: str, option: str, problem: str):
        super().__init__(f"{pass_name}: {problem}")
        self.pass_name = pass_name
        self.option = option
        self.problem = problem

    def __reduce__(self):
        # Pickled (a worker process's error, a copy) with its three parts, not the message.
        return type(self), (self.pass_name, self.option, self.problem)
