"""Zone-aware assignment of items (journals, shards) to members (brokers, consumers) over etcd.

Every member announces itself (`announce`) and runs `allocate` over a watched KeySpace; the
leader among them solves for the desired assignments (`solve`) and converges etcd towards
them in revision-checked transactions, never dropping an item below its desired number of
consistent replicas. See the modules' docstrings for the invariants of each part.
"""

from gazette.etcd.errors import TxnFailedError
from gazette.etcd.txn import BatchedTxn, Cmp, Delete, Put

from .allocator import Round, RoundHook, allocate
from .announce import Announcement, announce
from .converge import Counters, converge
from .errors import (
    AllocatorError,
    AnnounceConflictError,
    AnnouncementLostError,
    MemberNotFoundError,
)
from .model import Assignment, Entry, Item, Member
from .solver import Desired, solve
from .specs import (
    attach_endpoints,
    desired_replication,
    init_route,
    item_route,
    item_route_bytes,
    journal_is_consistent,
    member_capacity,
    route_of,
    routes_equivalent,
    shard_is_consistent,
)
from .state import IsConsistentFn, LocalItem, State

__all__ = [
    "AllocatorError",
    "AnnounceConflictError",
    "Announcement",
    "AnnouncementLostError",
    "Assignment",
    "BatchedTxn",
    "Cmp",
    "Counters",
    "Delete",
    "Desired",
    "Entry",
    "IsConsistentFn",
    "Item",
    "LocalItem",
    "Member",
    "MemberNotFoundError",
    "Put",
    "Round",
    "RoundHook",
    "State",
    "TxnFailedError",
    "allocate",
    "announce",
    "attach_endpoints",
    "converge",
    "desired_replication",
    "init_route",
    "item_route",
    "item_route_bytes",
    "journal_is_consistent",
    "member_capacity",
    "route_of",
    "routes_equivalent",
    "shard_is_consistent",
    "solve",
]
