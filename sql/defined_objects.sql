-- defined_objects: (name, definition) of each of featstore's views and macros ($1: their names) that the
-- connection's own database holds, as DuckDB prints them back (TEMP ones left out; a macro's overloads joined):
-- what a connection compares with this version's before it binds them again (analytics/db.py install_macros).
SELECT function_name AS name, string_agg(macro_definition, ';' ORDER BY macro_definition) AS definition
FROM duckdb_functions() WHERE database_name = current_database() AND list_contains($1, function_name) GROUP BY 1
UNION ALL
SELECT view_name, sql FROM duckdb_views()
WHERE database_name = current_database() AND NOT temporary AND list_contains($1, view_name)
ORDER BY 1;
