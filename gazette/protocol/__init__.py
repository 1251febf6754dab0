"""Wire protocol: generated protobuf/gRPC modules and their validation.

``protocol_pb2`` (package ``protocol``: journals, fragments, routes, the Journal
service), ``consumer_pb2`` (package ``consumer``: shards, checkpoints, the Shard
service) and ``recoverylog_pb2`` are generated from the ``.proto`` sources beside
this file by ``scripts/genproto.sh``; a test fails when they are stale.
"""
