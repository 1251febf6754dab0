"""Facts of a JournalSpec that both ends of the protocol act on (Gazette's
``journal_spec_extensions``).

Invariants: a spec whose ``flags`` are unset (``NOT_SPECIFIED``) may be read and written, as
Gazette treats it as O_RDWR.
"""

from __future__ import annotations

from gazette.protocol import protocol_pb2 as pb

__all__ = ["may_read", "may_write"]


def may_write(spec: pb.JournalSpec) -> bool:
    return spec.flags == pb.JournalSpec.NOT_SPECIFIED or bool(spec.flags & (pb.JournalSpec.O_WRONLY | pb.JournalSpec.O_RDWR))


def may_read(spec: pb.JournalSpec) -> bool:
    return spec.flags == pb.JournalSpec.NOT_SPECIFIED or bool(spec.flags & (pb.JournalSpec.O_RDONLY | pb.JournalSpec.O_RDWR))
