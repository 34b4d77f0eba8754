-- shadowing_objects: what a database file defines that would run in place of featstore's tables or of DuckDB's own
-- functions ($1: featstore's table names), as (kind, name) rows:
-- a view named like one of those tables, or a macro named like a built-in (a persisted `count_star` replaces
-- count(*) in every query). Reads the catalog only, so nothing of the file is evaluated.
WITH functions AS MATERIALIZED (  -- DuckDB lists its functions at ~0.05 s a scan: scanned once
    SELECT database_name, function_name, function_type FROM duckdb_functions())
SELECT 'view' AS kind, view_name AS name FROM duckdb_views()
WHERE database_name = current_database() AND NOT temporary AND NOT internal AND list_contains($1, lower(view_name))
UNION
SELECT 'macro', function_name FROM functions
WHERE database_name = current_database() AND function_type IN ('macro', 'table_macro')
  AND lower(function_name) IN (SELECT lower(function_name) FROM functions WHERE database_name = 'system')
ORDER BY 1 DESC, 2;
