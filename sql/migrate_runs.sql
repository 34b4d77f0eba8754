-- migrate_runs: gives a `runs` table written before featstore kept the probes' identity in columns (it sat only in
-- the params JSON: probe_id, probe_name, probe_version) those columns, filled from params (probe_id falls back to
-- the variant's name). Run on every write connection, and on a read-only TEMP copy of an old file's runs.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_id VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_name VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_version VARCHAR;
UPDATE runs SET probe_id = coalesce(json_extract_string(params, '$.probe_id'), probe),
                probe_name = json_extract_string(params, '$.probe_name'),
                probe_version = json_extract_string(params, '$.probe_version')
WHERE probe_id IS NULL;
