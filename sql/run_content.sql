-- run_content(tbl) -> the rows of a runs table (by name: 'runs', 'src.runs') without created_at and the columns
-- an older featstore kept only in params (probe_id, probe_name, probe_version, streamed, C, which migrate_runs
-- derives from params): what merge compares of a run, so that a source written before those columns compares by
-- the same content.
CREATE OR REPLACE MACRO run_content(tbl) AS TABLE
SELECT COLUMNS(lambda c: lower(c) NOT IN ('created_at', 'probe_id', 'probe_name', 'probe_version', 'streamed', 'c'))
FROM query_table(tbl);
