"""Every value, default and choice the library declares, as the CLI's options read them (featstore.cli.options):
the records (`ModelSpec`, `ImageSource`, `RunOptions`), `featstore.schema`'s fields and defaults, the scopes, the
bands and the exit policies' defaults. The CLI reads them here, through the API, so that it imports nothing
beneath it; each name is the library's own object, found in the module that declares it."""

from __future__ import annotations

from importlib import import_module
from typing import Any

# where the declarations live, looked up in this order (a name is taken from the first that has it)
SOURCES = ("featstore.schema", "featstore.compute.specs", "featstore.analytics.exit_policies")


def __getattr__(name: str) -> Any:
    """A declared name, from the module that declares it."""
    if not name.startswith("__"):
        for source in SOURCES:
            module = import_module(source)
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
