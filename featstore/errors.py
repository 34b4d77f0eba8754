"""One exception type for mistakes a user can fix; the CLI prints its message as a single line."""

from __future__ import annotations


class FeatstoreError(Exception):
    """A problem with the user's input (a file, a flag, a store) whose message names the file and the fix."""


class FeatstoreWarning(UserWarning):
    """Something a user should know that does not stop the command; the CLI prints it as one line."""
