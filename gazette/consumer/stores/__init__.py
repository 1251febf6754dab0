"""Stores of consumer shards. ``memory`` (tests and stateless apps); the SQL, JSON-file and
embedded (RocksDB, SQLite) stores come with the shard runtime and recovery logs. No backend
is imported eagerly."""
