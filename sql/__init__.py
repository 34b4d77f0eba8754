"""SQL shipped with featstore: schema, views and macros, one .sql file each."""
