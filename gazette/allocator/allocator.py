"""`allocate`: the per-member allocation loop, which only the leader's instance acts in.

Every member runs `allocate` over its own KeySpace (which the caller keeps current with
`KeySpace.watch`). After each keyspace update the loop re-extracts a `State`; if the local
member is the leader (lowest member create revision) it converges the assignments one round
towards the solver's desired set, in batched transactions that each also re-check the
leader's own member key. It then waits for the keyspace to pass the revision it wrote (or the
next revision, if it wrote nothing), so no round acts on a view older than its own writes.

Invariants:

* The desired set is re-solved only when items, members or limits change
  (`State.network_key`); otherwise rounds keep converging towards the last solution, which is
  still a valid maximum assignment. This avoids churn from re-solving mid-convergence.
* A failed round (a revision check lost to a concurrent change, or etcd unreachable) is
  retried after the next keyspace update, or after `retry_interval` if none comes.
* `allocate` returns once the local member is exiting and holds no assignments: the graceful
  exit path is to set the member's `exiting` (see `Announcement.update`) and await this.
  It raises MemberNotFoundError if the local member key is absent (e.g. its lease expired).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aetcd
import grpc

from gazette.etcd.errors import TxnFailedError
from gazette.etcd.keyspace import KeySpace
from gazette.etcd.txn import DEFAULT_MAX_OPS, BatchedTxn, Cmp

from .converge import Counters, converge
from .errors import MemberNotFoundError
from .solver import Desired, solve
from .specs import desired_replication
from .state import EntryCache, IsConsistentFn, State, leader_view

log = logging.getLogger(__name__)

# Item count from which the solver runs in a worker thread rather than on the event loop.
SOLVE_IN_THREAD_ITEMS = 1000


@dataclass(frozen=True, slots=True)
class Round:
    """What one leader round did, for observers and tests."""

    number: int
    revision: int  # Keyspace revision the round acted on.
    idle: bool  # True if the round wrote nothing: the allocation has converged.
    counters: Counters
    desired: int  # Size of the desired assignment set.
    item_slots: int  # Total desired replicas; desired < item_slots means under-replication.


RoundHook = Callable[[Round], None]


async def allocate(
    client: aetcd.Client,
    keyspace: KeySpace,
    local_member_key: str,
    is_consistent: IsConsistentFn,
    *,
    on_round: RoundHook | None = None,
    max_txn_ops: int = DEFAULT_MAX_OPS,
    retry_interval: float = 1.0,
    replication: Callable[[object], int] = desired_replication,
) -> None:
    """Runs the allocation loop until the local member may exit (see the module docstring)."""
    desired: list[Desired] = []
    solved_for: tuple[object, ...] | None = None
    round_number = 0
    cache = EntryCache()  # entries decoded in earlier rounds: a round decodes only what changed

    while True:
        member, is_leader = leader_view(keyspace, local_member_key)
        if member is None:
            raise MemberNotFoundError(
                f"member key {local_member_key!r} is not in etcd (revision "
                f"{keyspace.revision}): was it announced, and is its lease alive?"
            )
        next_revision = keyspace.revision + 1
        timeout: float | None = None

        # Only the leader, or an exiting member deciding whether it may go, needs the full
        # (linear-time) State; other members just wait for the next update.
        state = None
        if is_leader or member.decoded.exiting:
            state = State.from_keyspace(keyspace, local_member_key, is_consistent, replication, cache)
            if state.should_exit:
                log.info("member %s is exiting and holds no assignments", local_member_key)
                return

        if state is not None and is_leader:
            if state.network_key != solved_for:
                started = time.monotonic()
                if len(state.items) >= SOLVE_IN_THREAD_ITEMS:
                    # Large solves take a while: keep the event loop serving meanwhile.
                    desired = await asyncio.to_thread(solve, state)
                else:
                    desired = solve(state)
                solved_for = state.network_key
                log.info(
                    "solved for %d of %d item slots over %d members in %.3fs (revision %d)",
                    len(desired), state.item_slots, len(state.members),
                    time.monotonic() - started, state.revision,
                )
                if len(desired) < state.item_slots:
                    log.warning(
                        "cannot reach desired replication: %d replicas unattainable with "
                        "current members and limits", state.item_slots - len(desired)
                    )

            txn = BatchedTxn(client, [Cmp(member.key, "mod", member.mod_revision)], max_txn_ops)
            try:
                counters = await converge(txn, state, desired)
                await txn.flush()
            except (TxnFailedError, grpc.aio.AioRpcError, aetcd.exceptions.ClientError) as err:
                log.warning("allocation round at revision %d failed (will retry): %s",
                            state.revision, err)
                timeout = retry_interval
            else:
                if on_round is not None:
                    on_round(Round(round_number, state.revision, txn.revision == 0, counters,
                                   len(desired), state.item_slots))
                round_number += 1
            # Read through whatever was applied, even if a later transaction failed.
            next_revision = max(next_revision, txn.revision)

        try:
            await keyspace.wait_for_revision(next_revision, timeout=timeout)
        except TimeoutError:
            pass  # Retry the failed round against the (unchanged) keyspace.
