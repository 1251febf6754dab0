"""Errors raised by the allocator.

    AllocatorError                 base of everything below
    ├── MemberNotFoundError        the local member key is absent from the keyspace
    ├── AnnounceConflictError      a live member already holds the key we want to announce
    ├── AnnouncementLostError      our member key was changed or deleted by someone else
    └── SolverProcessError         the solver's child process failed to start or to answer

(A transaction that did not apply is ``gazette.etcd.errors.TxnFailedError``.)
"""

from __future__ import annotations

from gazette.errors import GazetteError


class AllocatorError(GazetteError):
    """Base of all allocator errors."""


class MemberNotFoundError(AllocatorError):
    """The local member key is not (or is no longer) present in etcd."""


class AnnounceConflictError(AllocatorError):
    """Another live process holds the member key this process wants to announce."""


class AnnouncementLostError(AllocatorError):
    """The announced member key was modified or deleted by another party."""



class SolverProcessError(AllocatorError):
    """The solver's child process failed to start or to answer (the leader then solves in a
    thread)."""
