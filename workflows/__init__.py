"""Orchestration of whole pipelines (demo, study, zoo): the layer above probing and analytics."""
