-- macro_set: the one row naming the definitions (views and macros) a write connection last put into the file: the
-- digest of their sql/ text and the digest of the file's definitions as DuckDB printed them back just after.
CREATE TABLE IF NOT EXISTS macro_set (source_digest VARCHAR NOT NULL, printed_digest VARCHAR NOT NULL);
