"""Revision-checked etcd transactions, batched across "checkpoints".

A checkpoint is a group of comparisons and operations which must apply together. `BatchedTxn`
packs consecutive checkpoints into one etcd transaction until another would exceed
`max_ops` comparisons or operations (etcd's default --max-txn-ops is 128), then flushes.

Invariants:

* The ops of one checkpoint are never split across transactions.
* Every transaction also asserts the `fixed` comparisons (e.g. "my member key is unchanged",
  which re-verifies leadership with each write).
* A transaction whose comparisons fail raises TxnFailedError and applies nothing; earlier
  flushed transactions stay applied, and `revision` is the etcd revision of the last applied
  one (0 if none), which the caller must read through before acting again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import aetcd

from gazette.etcd.errors import TxnFailedError

DEFAULT_MAX_OPS = 128


@dataclass(frozen=True, slots=True)
class Cmp:
    """Compare `key`'s mod or create revision for equality with `revision`.

    A create revision of 0 asserts the key does not exist.
    """

    key: str
    target: Literal["mod", "create"]
    revision: int


@dataclass(frozen=True, slots=True)
class Put:
    """Put `value` at `key`, under `lease` (0: none), or keeping its lease if `ignore_lease`."""

    key: str
    value: bytes
    lease: int = 0
    ignore_lease: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Op = Put | Delete


def _compare(c: Cmp) -> aetcd.rpc.Compare:
    if c.target == "mod":
        return aetcd.rpc.Compare(
            key=c.key.encode(),
            target=aetcd.rpc.Compare.MOD,
            result=aetcd.rpc.Compare.EQUAL,
            mod_revision=c.revision,
        )
    return aetcd.rpc.Compare(
        key=c.key.encode(),
        target=aetcd.rpc.Compare.CREATE,
        result=aetcd.rpc.Compare.EQUAL,
        create_revision=c.revision,
    )


def _request(op: Op) -> aetcd.rpc.RequestOp:
    if isinstance(op, Put):
        return aetcd.rpc.RequestOp(
            request_put=aetcd.rpc.PutRequest(
                key=op.key.encode(), value=op.value, lease=op.lease, ignore_lease=op.ignore_lease
            )
        )
    return aetcd.rpc.RequestOp(request_delete_range=aetcd.rpc.DeleteRangeRequest(key=op.key.encode()))


async def commit(
    client: aetcd.Client,
    cmps: Sequence[Cmp],
    ops: Sequence[Op],
    failure: Sequence[aetcd.rpc.RequestOp] = (),
) -> aetcd.rpc.TxnResponse:
    """Runs one etcd transaction and returns etcd's response (its header has the revision).

    aetcd's own `transaction()` drops the response header, which callers need in order to
    read through their own writes, so this speaks to the KV service directly.
    """
    await client.connect()
    request = aetcd.rpc.TxnRequest(
        compare=[_compare(c) for c in cmps],
        success=[_request(op) for op in ops],
        failure=list(failure),
    )
    response: aetcd.rpc.TxnResponse = await client.kvstub.Txn(request, metadata=client.metadata)
    return response


@dataclass(frozen=True, slots=True)
class ItemChange:
    """An upsert (``value`` set) or delete (``value`` None) of the spec at ``key``, expecting
    its mod revision to be ``expect_mod_revision`` (0: it must not exist; -1: unchecked), as
    Gazette's ApplyRequest.Change for journals and shards alike."""

    key: str
    value: bytes | None
    expect_mod_revision: int = -1


async def apply_changes(
    client: aetcd.Client, changes: Sequence[ItemChange], extra: Sequence[Cmp] = ()
) -> aetcd.rpc.TxnResponse:
    """Applies spec changes in one transaction, checked against each change's expected mod
    revision and the ``extra`` comparisons; returns etcd's response (``succeeded`` says
    whether it applied, its header the revision to read through)."""
    cmps = list(extra)
    ops: list[Op] = []
    for ch in changes:
        ops.append(Delete(ch.key) if ch.value is None else Put(ch.key, ch.value))
        if ch.expect_mod_revision != -1:
            cmps.append(Cmp(ch.key, "mod", ch.expect_mod_revision))
    return await commit(client, cmps, ops)


class BatchedTxn:
    """Packs checkpoints into as few etcd transactions as the op limit allows."""

    def __init__(
        self, client: aetcd.Client, fixed: Sequence[Cmp] = (), max_ops: int = DEFAULT_MAX_OPS
    ) -> None:
        if len(fixed) >= max_ops:
            raise ValueError(f"{len(fixed)} fixed comparisons leave no room under {max_ops} ops")
        self._client = client
        self._fixed = list(fixed)
        self._max_ops = max_ops
        self._cmps: list[Cmp] = []
        self._ops: list[Op] = []
        self._next_cmps: list[Cmp] = []
        self._next_ops: list[Op] = []
        self.revision = 0
        self.transactions = 0

    def when(self, *cmps: Cmp) -> None:
        self._next_cmps.extend(cmps)

    def then(self, *ops: Op) -> None:
        self._next_ops.extend(ops)

    async def checkpoint(self) -> None:
        nc, no = self._next_cmps, self._next_ops
        self._next_cmps, self._next_ops = [], []
        if not no:
            assert not nc, "comparisons must come with operations"
            return
        base = len(self._fixed) if not self._cmps else 0
        if self._ops and (
            len(self._cmps) + len(nc) > self._max_ops or len(self._ops) + len(no) > self._max_ops
        ):
            await self.flush()
            base = len(self._fixed)
        if base + len(nc) > self._max_ops or len(no) > self._max_ops:
            raise ValueError(f"one checkpoint needs more than {self._max_ops} comparisons or ops")
        if not self._cmps:
            self._cmps.extend(self._fixed)
        self._cmps.extend(nc)
        self._ops.extend(no)

    async def flush(self) -> None:
        assert not self._next_cmps and not self._next_ops, "checkpoint before flushing"
        if not self._ops:
            return
        cmps, ops = self._cmps, self._ops
        self._cmps, self._ops = [], []
        response = await commit(self._client, cmps, ops)
        if not response.succeeded:
            # Not recording this revision: it may lie outside the watched keyspace, and
            # waiting for it there could block forever.
            raise TxnFailedError(
                f"transaction of {len(ops)} ops did not apply: one of {len(cmps)} revision "
                "checks failed (the keyspace changed concurrently)"
            )
        self.revision = response.header.revision
        self.transactions += 1
