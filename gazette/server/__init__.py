"""Process and server scaffolding shared by brokers and consumers.

``mux`` (one port for gRPC and HTTP), ``grpc`` (building the gRPC server and registering any
generated servicer), ``http`` (the aiohttp app with ``/debug/metrics`` and ``/debug/ready``),
``edge`` (errors to statuses, once, for every service) and ``process`` (the member-process
lifecycle over etcd: keyspace, announce, allocate, drain, revoke). Nothing here imports
``gazette.broker`` or ``gazette.consumer``: both are built on it.
"""
