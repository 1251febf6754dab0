"""The consumer framework: shards, their specs, recovery logs and transactions."""
