"""`ExpandError`, in a module of its own so the compiled expander and the same source loaded
uncompiled (the oracle in the twin tests) raise one and the same class."""


class ExpandError(ValueError):
    """A structural error found while flattening the tree; the message names the DSL path."""
