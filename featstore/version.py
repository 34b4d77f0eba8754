"""featstore's version, read from the installed package's metadata: pyproject.toml is the one place it is written.
What records the version (a store's build provenance, a probe run's parameters) imports it from here; the front
door resolves `featstore.__version__` here on first use (importlib.metadata costs import time)."""

from importlib.metadata import version

__version__ = version("featstore")
