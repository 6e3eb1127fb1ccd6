"""The one exception type a user ever sees.

Every error a user can cause (a bad file, an unknown preset, a placement that breaks a rule) is raised
as a :class:`PostplaceError` whose message is a single line saying what is wrong, where, and how to fix
it. The CLI prints that line and exits non-zero; it never shows a traceback for these.
"""


class PostplaceError(ValueError):
    """A user-facing error: one line, what went wrong, where, and how to fix it."""
