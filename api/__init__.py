"""featstore's public Python API (docs/python.md), the layer the CLI calls: above the jobs, below the CLI.

One module per role, each imported by its own name (`from featstore.api.store import open_store`): a store,
read-only (`open_store`, store.py); probes fitted on in-memory arrays with the CLI's own solver (`Probe`,
estimator.py); the jobs `build` and `probe` (a registered variant or any scikit-learn estimator, landed in DuckDB
like every run) and `register_probe` (jobs.py); the saved probes read back (`load_probe`, saved.py); the results
read-only (`connect`, results.py); the other jobs, one per command (tasks.py); the declared values the CLI's options
read (declared.py); the jobs' records under their public names (configs.py). This package itself imports nothing,
so the CLI's `--help` loads only the light modules it names; `import featstore as fs` re-exports the public names
(featstore/__init__.py).
"""
