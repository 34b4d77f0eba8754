"""The exceptions and warnings of mistakes a user can fix. Each carries what it is about as data: the field it
names (`field`), the value given for it (`value`) and why that value fails (`reason`), as scikit-learn's
InvalidParameterError names its parameter; `str()` says all three in one line, as a Python caller writes them
(`val_frac=1.5: must be ...`), and the CLI says the same parts with its own flags (`--val-frac 1.5: must be ...`).
A message names another field (`Name`) or a next step (`Step`) as a part of its reason, never as text to rewrite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def shown(value: Any) -> str:
    """How a message quotes a value: strings and lists as Python writes them, numbers plainly."""
    return repr(value) if isinstance(value, str | list | dict | bool) or value is None else str(value)


NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()  # a field named without a value


@dataclass(frozen=True)
class Name:
    """A field a message names inside its reason (`pass Name("skip_bad") to go on`), with the value it suggests
    (`Name("variant", "lens-direct")`) or none: a Python caller reads the keyword argument (`skip_bad`,
    `variant='lens-direct'`), a command-line user the flag that sets it (`--skip-bad`, `--variant lens-direct`)."""

    field: str
    value: Any = NO_VALUE

    def __str__(self) -> str:
        return f"`{self.field}`" if self.value is NO_VALUE else f"{self.field}={shown(self.value)}"

    def as_flag(self, flag: str) -> str:
        return flag if self.value is NO_VALUE else f"{flag} {self.value}"


@dataclass(frozen=True)
class Step:
    """A next step a message suggests: the Python call that takes it (`fs.open_store(store).verify()`), and the
    name of the API function (`verify`), by which the CLI finds the command that takes it."""

    call: str
    function: str
    switches: tuple[str, ...] = ()  # the call's boolean fields set to True (`every`: the CLI says its flag, `--all`)

    def __str__(self) -> str:
        return self.call


Part = str | Name | Step


class Refusal:
    """What featstore's errors and warnings share: `field` (the name a Python caller gives it, or None), `value`
    (what was given for it, `NO_VALUE` when the message names the field alone), `parts` (the reason: text, the
    fields (`Name`) and next steps (`Step`) it names) and `reason` (those parts as a Python caller reads them)."""

    field: str | None
    value: Any
    parts: tuple[Part, ...]

    def _hold(self, parts: tuple[Part, ...], field: str | None, value: Any) -> str:
        self.parts, self.field, self.value = parts, field, value
        return self.one_line()

    @property
    def reason(self) -> str:
        return "".join(map(str, self.parts))

    def whole(self) -> tuple[Part, ...]:
        """Its field and value (as a `Name`) and its reason, as parts: what a refusal that wraps it (`study file
        X: ...`) says after its own words, each face still saying the field its own way."""
        return self.parts if self.field is None else (Name(self.field, self.value), ": ", *self.parts)

    def one_line(self, flag: Callable[[str], str | None] = lambda _: None,
                 value: Callable[[str, Any], str] | None = None, step: Callable[[Step], str] = str) -> str:
        """The one line, with each field as `flag` spells it (None: as a Python caller writes it), the value as
        `value(field, value)` gives it, and each next step as `step` says it; by default as `str()` says it."""
        body = "".join(part if isinstance(part, str) else step(part) if isinstance(part, Step)
                       else _named(part, flag(part.field)) for part in self.parts)
        if self.field is None:
            return body
        spelled = flag(self.field)
        given = NO_VALUE if self.value is NO_VALUE else value(self.field, self.value) if value else shown(self.value)
        if spelled is None:
            head = self.field if given is NO_VALUE else f"{self.field}={given}"
        else:
            head = spelled if given is NO_VALUE else f"{spelled} {given}"
        return f"{head}: {body}" if body else head


def _named(name: Name, flag: str | None) -> str:
    return str(name) if flag is None else name.as_flag(flag)


class FeatstoreError(Refusal, ValueError):
    """A problem with the user's input (a file, an argument, a store): a ValueError, as scikit-learn's and numpy's
    refusals of bad input are, so code that catches those catches it. `FeatstoreError(*parts, field=, value=)`:
    the reason in parts (text, `Name`, `Step`), the field it is about and the value given for it."""

    def __init__(self, *parts: Part, field: str | None = None, value: Any = NO_VALUE):
        super().__init__(self._hold(parts, field, value))


class FeatstoreTypeError(FeatstoreError, TypeError):
    """An argument of the wrong kind (`runs=123`, `db=None`, `min_conf='0.5'`): one line naming the field, and the
    TypeError Python's own functions raise for it, so code that catches either catches it."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C that featstore caught mid-write and rolled back: a KeyboardInterrupt (code that stops on Ctrl-C still
    stops; no `except ValueError` swallows it) whose message says what was rolled back (the CLI says it in one
    line, exit status 2)."""


class FeatstoreWarning(Refusal, UserWarning):
    """Something a user should know that does not stop the command; the CLI prints it as one line. Built as
    `FeatstoreError` is (`FeatstoreWarning(*parts, field=, value=)`), and given to `warnings.warn` as it is."""

    def __init__(self, *parts: Part, field: str | None = None, value: Any = NO_VALUE):
        super().__init__(self._hold(parts, field, value))


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
