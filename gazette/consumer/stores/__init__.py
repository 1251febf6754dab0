"""Stores of consumer shards: ``memory`` (tests and stateless apps), ``json_file`` (a JSON
document per shard), ``sql`` (``SQLStore``: PostgreSQL or SQLite through SQLAlchemy's asyncio
engines, fenced by a checkpoint row; ``SyncSQLStore``: the same over a synchronous ``Engine``), and the embedded ``rocksdb`` and ``sqlite`` stores,
recorded into the shard's recovery log. No backend is imported eagerly: apps import them from
``gazette.consumer``, which loads each on first use."""
