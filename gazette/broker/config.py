"""A broker process's configuration: its flags (``gazette serve``), as one dataclass.

Invariants: every field has Gazette's default; rates are bytes per second, 0 meaning no limit
for ``max_append_rate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gazette.rpc.tls import ClientTLS, ServerTLS
from gazette.server.limits import ServerLimits
from gazette.server.process import random_suffix

__all__ = ["BrokerConfig"]


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    zone: str = "local"
    suffix: str = field(default_factory=random_suffix)
    file_root: str = "fragment-store"
    limit: int = 1024
    max_replication: int = 9
    etcd_address: str = "http://127.0.0.1:2379"
    etcd_prefix: str = "/gazette/cluster"
    etcd_lease: float = 20.0
    etcd_tls: ClientTLS | None = None  # how an https:// etcd_address is dialled
    advertise_host: str | None = None
    # Append flow control, bytes per second (see broker/flow.py); max 0 is no limit.
    max_append_rate: int = 0
    min_append_rate: int = 1 << 16
    # Idle journals: a primary pulses each journal every health_interval seconds; with
    # auto_suspend, a journal stable for AUTO_SUSPEND_TICKS of them and wholly persisted is
    # suspended (Gazette's --broker.auto-suspend), costing nothing until its next append.
    auto_suspend: bool = False
    health_interval: float = 60.0
    # Security: TLS of the broker's port (mTLS if it names a client CA), TLS of its dials to
    # peers, and the keys signing and verifying bearer tokens ("" is authorization off).
    tls: ServerTLS | None = None
    peer_tls: ClientTLS | None = None
    auth_keys: str = ""
    limits: ServerLimits = field(default_factory=ServerLimits)  # --server.*: memory and fd budget
