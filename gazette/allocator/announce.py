"""`Announcement`: a member key held in etcd under this process's lease.

The key says "this member exists, with this spec, and is alive": it is created only if
absent, lives as long as the lease is kept alive, and is deleted (with every assignment put
under the same lease) when the lease is revoked or expires.

Invariants:

* `announce` never overwrites a key held by another lease: it fails with
  AnnounceConflictError, or, with `conflict_timeout`, waits up to that long for the holder's
  lease to expire, keeping its own lease alive meanwhile (a lease shorter than the wait would
  otherwise lapse just as the key is created under it). A key already held by *our* lease (a
  retried create) is adopted.
* `update` replaces the value only if the key is unchanged since our last write (compare mod
  revision) and keeps the key's lease; otherwise AnnouncementLostError.
* `keep_alive` refreshes the lease every ttl/3 seconds, retries while etcd is unreachable, and
  raises AnnouncementLostError once etcd reports the lease gone. `revoke` (and leaving `async with`) revokes the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType

import aetcd

from gazette.etcd.client import TRANSIENT_ERRORS
from gazette.etcd.txn import Cmp, Put, commit

from .errors import AnnounceConflictError, AnnouncementLostError

log = logging.getLogger(__name__)

# A refresh failing with one of these (or timing out) is retried: etcd is unreachable.
_RETRIED: tuple[type[Exception], ...] = (TimeoutError, *TRANSIENT_ERRORS)


class Announcement:
    """A live member key; build one with `announce`."""

    def __init__(self, client: aetcd.Client, key: str, lease_id: int, ttl: int, revision: int):
        self.client = client
        self.key = key
        self.lease_id = lease_id
        self.ttl = ttl
        self.revision = revision  # Mod revision of our latest write of the key.
        self._keep_alive: asyncio.Task[None] | None = None

    async def update(self, value: bytes) -> None:
        """Replaces the announced value (e.g. a spec marked `exiting`)."""
        response = await commit(
            self.client,
            [Cmp(self.key, "mod", self.revision)],
            [Put(self.key, value, ignore_lease=True)],
        )
        if not response.succeeded:
            raise AnnouncementLostError(
                f"member key {self.key!r} was modified or deleted by another party "
                f"(expected mod revision {self.revision})"
            )
        self.revision = response.header.revision

    async def keep_alive(self) -> None:
        """Refreshes the lease until cancelled; raises once etcd reports it expired.

        An etcd that cannot be reached (restarting, partitioned) is retried, however long: the
        lease's fate is etcd's to tell (a restarted etcd restores leases with a fresh TTL), and
        a process cut off past its TTL is a zombie the fences of its peers already refuse."""
        interval = max(self.ttl / 3.0, 0.1)
        unreachable_since: float | None = None
        while True:
            try:
                # Not asyncio.wait_for: on Python 3.11 a cancellation arriving as the refresh
                # completes is swallowed by it (the refresh's result is returned instead), and
                # this loop then outlived its task group's cancellation: a draining process hung.
                async with asyncio.timeout(max(interval, 1.0)):
                    reply = await self.client.refresh_lease(self.lease_id)
            except _RETRIED as err:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                log.warning("lease %x of %s: etcd unreachable for %.1fs (%s); retrying", self.lease_id,
                            self.key, now - unreachable_since, str(err) or type(err).__name__)
                await asyncio.sleep(min(interval, 0.5))  # the retry period
                continue
            if reply is None or reply.TTL <= 0:
                raise AnnouncementLostError(
                    f"lease {self.lease_id:x} of member key {self.key!r} expired"
                )
            if unreachable_since is not None:
                log.info("lease %x of %s refreshed after %.1fs without etcd", self.lease_id, self.key,
                         time.monotonic() - unreachable_since)
                unreachable_since = None
            await asyncio.sleep(interval)  # The refresh period, not a synchronisation.

    async def revoke(self) -> None:
        """Revokes the lease, deleting the member key and every key under the lease."""
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            await asyncio.gather(self._keep_alive, return_exceptions=True)
            self._keep_alive = None
        await self.client.revoke_lease(self.lease_id)

    async def __aenter__(self) -> Announcement:
        self._keep_alive = asyncio.create_task(self.keep_alive(), name=f"keep-alive {self.key}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        keep_alive = self._keep_alive
        await self.revoke()
        if keep_alive is not None and keep_alive.done() and not keep_alive.cancelled():
            if (err := keep_alive.exception()) is not None and exc is None:
                raise err


async def announce(
    client: aetcd.Client,
    key: str,
    value: bytes,
    *,
    ttl: int = 20,
    conflict_timeout: float = 0.0,
    retry_interval: float = 1.0,
) -> Announcement:
    """Creates `key` = `value` under a new lease of `ttl` seconds (see the module docstring).

    Use as `async with await announce(...) as ann:` to keep the lease alive meanwhile and
    revoke it on exit.
    """
    lease = await client.lease(ttl)
    deadline = time.monotonic() + conflict_timeout
    try:
        while True:
            response = await commit(
                client,
                [Cmp(key, "create", 0)],
                [Put(key, value, lease.id)],
                failure=[aetcd.rpc.RequestOp(
                    request_range=aetcd.rpc.RangeRequest(key=key.encode())
                )],
            )
            if response.succeeded:
                return Announcement(client, key, lease.id, ttl, response.header.revision)
            kvs = response.responses[0].response_range.kvs
            if kvs and kvs[0].lease == lease.id:
                return Announcement(client, key, lease.id, ttl, kvs[0].mod_revision)
            holder = kvs[0].lease if kvs else 0
            if time.monotonic() >= deadline:
                raise AnnounceConflictError(
                    f"member key {key!r} is already held by live lease {holder:x}: is another "
                    "process running with the same zone and suffix?"
                )
            log.warning("member key %s is held by lease %x; retrying until it expires",
                        key, holder)
            # Polling cadence while waiting for the other lease's TTL to run out.
            await asyncio.sleep(min(retry_interval, max(0.0, deadline - time.monotonic())))
            # Our own lease must outlive the wait: the key is created under it once free.
            reply = await client.refresh_lease(lease.id)
            if reply is None or reply.TTL <= 0:
                lease = await client.lease(ttl)
    except BaseException:
        await client.revoke_lease(lease.id)
        raise
