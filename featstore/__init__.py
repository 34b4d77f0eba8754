"""featstore: a feature store of pooled anchor activations, and the analytics of when a network decides."""

__version__ = "0.1.0"
