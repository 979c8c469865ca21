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
