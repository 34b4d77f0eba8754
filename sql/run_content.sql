-- run_content(tbl) -> the rows of a runs table (by name: 'runs', 'src.runs') without created_at and the probe
-- identity columns (probe_id, probe_name, probe_version, which migrate_runs derives from params): what merge
-- compares of a run, so that a source written before those columns compares by the same content.
CREATE OR REPLACE MACRO run_content(tbl) AS TABLE
SELECT COLUMNS(lambda c: c NOT IN ('created_at', 'probe_id', 'probe_name', 'probe_version')) FROM query_table(tbl);
