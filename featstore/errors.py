"""One exception type for mistakes a user can fix; the CLI prints its message as a single line."""

from __future__ import annotations


class FeatstoreError(ValueError):
    """A problem with the user's input (a file, a flag, a store) whose message names the file and the fix: a
    ValueError, as scikit-learn's and numpy's refusals of bad input are, so code that catches those catches it."""


class FeatstoreTypeError(FeatstoreError, TypeError):
    """An argument of the wrong kind (`runs=123`, `db=None`, `min_conf='0.5'`): one line naming the field, and the
    TypeError Python's own functions raise for it, so code that catches either catches it."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C that featstore caught mid-write and rolled back: a KeyboardInterrupt (code that stops on Ctrl-C still
    stops; no `except ValueError` swallows it) whose message says what was rolled back (the CLI says it in one
    line, exit status 2)."""


class FeatstoreWarning(UserWarning):
    """Something a user should know that does not stop the command; the CLI prints it as one line."""


def storage_failure(error: BaseException) -> str | None:
    """When `error` (or what it was raised from) is object storage failing to answer (obstore's errors: a server
    that went away, a network cut), its first line; None for anything else. The CLI says it in one line instead of
    a traceback: every commit is atomic, so a rerun resumes."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__module__.split(".")[0] == "obstore":
            return f"{type(current).__name__}: {(str(current).splitlines() or [''])[0][:240]}"
        current = current.__cause__ or current.__context__
    return None


DUCKDB_SIGINT = "Query interrupted"  # the RuntimeError DuckDB raises when a SIGINT lands during one of its queries


def interrupted(error: BaseException) -> bool:
    """Whether `error` is Ctrl-C: a KeyboardInterrupt, or DuckDB's own forms of it, which are no KeyboardInterrupt:
    a SIGINT during one of its queries raises a plain RuntimeError("Query interrupted"), and
    `connection.interrupt()` its InterruptException."""
    return isinstance(error, KeyboardInterrupt) or (type(error) is RuntimeError and str(error) == DUCKDB_SIGINT) or (
        type(error).__name__ == "InterruptException" and type(error).__module__.lstrip("_").startswith("duckdb"))


class RunReplaced(FeatstoreWarning):
    """A probe job replaced a run of the same id the database held (the CLI says so on its own line and may ignore
    this one)."""
