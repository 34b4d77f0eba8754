-- migrate_runs: upgrades the runs and probe_fits of a file an older featstore wrote, which kept part of a run's
-- identity only inside JSON: the probes' identity (probe_id, falling back to the variant's name, probe_name,
-- probe_version) and streamed in runs.params, the L2 strength a variant pins (C > 0; C = 0 lets the search choose)
-- in runs.params, and the C each fit used in probe_fits.info. It fills the typed columns only of the rows of runs an
-- older featstore wrote (streamed NULL: this version's writer fills every column from the run's identity and fits,
-- and the fits of its runs are never read again from info), then takes the identity's keys out of every row's
-- params (the columns hold them), so that params holds the variant's parameters and the job's settings alone; run on
-- opening a file for writing, after `featstore merge` folds in a source, and on a read-only TEMP copy of an older
-- file's two tables.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_id VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_name VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_version VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS streamed BOOLEAN;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS C DOUBLE;
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS C DOUBLE;
UPDATE probe_fits SET C = TRY_CAST(info->>'C' AS DOUBLE)
WHERE run_id IN (SELECT run_id FROM runs WHERE streamed IS NULL);
UPDATE runs SET probe_id = coalesce(json_extract_string(params, '$.probe_id'), probe),
                probe_name = json_extract_string(params, '$.probe_name'),
                probe_version = json_extract_string(params, '$.probe_version')
WHERE probe_id IS NULL;
UPDATE runs SET streamed = coalesce(TRY_CAST(params->>'streamed' AS BOOLEAN), false),
                C = CASE WHEN TRY_CAST(params->>'C' AS DOUBLE) > 0 THEN TRY_CAST(params->>'C' AS DOUBLE) END
WHERE streamed IS NULL;
UPDATE runs SET params = json_remove(json_remove(json_remove(json_remove(params, '$.probe_id'), '$.probe_name'),
                                                  '$.probe_version'), '$.streamed')
WHERE list_has_any(json_keys(params), ['probe_id', 'probe_name', 'probe_version', 'streamed']);
