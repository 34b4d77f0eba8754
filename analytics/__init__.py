"""DuckDB/Polars analytics over the predictions: timelines, decision layers, reports, early exit, circuits."""
