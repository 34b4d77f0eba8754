-- run_content(tbl) -> the rows of a runs table (by name: 'runs', 'src.runs') without created_at and the columns
-- an older featstore kept only in params (probe_id, probe_name, probe_version, streamed, C, which migrate_runs
-- derives from params), with params less those identity keys and the stored weights' version read from its column
-- or, in an older file, from params: what merge compares of a run, so that a source written before those columns
-- compares by the same content.
CREATE OR REPLACE MACRO run_content(tbl) AS TABLE
SELECT COLUMNS(lambda c: lower(c) NOT IN ('created_at', 'probe_id', 'probe_name', 'probe_version', 'streamed', 'c',
                                          'params')),
       json_remove(json_remove(json_remove(json_remove(params, '$.probe_id'), '$.probe_name'), '$.probe_version'),
                   '$.streamed') AS params,
       coalesce(to_json(r)->>'probe_version', params->>'probe_version') AS weights_version
FROM query_table(tbl) r;
