"""The user-facing error of configurations and of the files that carry them."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration (or a file describing one) cannot be used; the message says what is wrong and the fix."""
