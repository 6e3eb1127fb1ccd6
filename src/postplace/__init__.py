"""postplace: fast device placements for deep-learning training (the Post algorithm)."""

from postplace.errors import PostplaceError

__all__ = ["PostplaceError"]
__version__ = "0.1.0"
