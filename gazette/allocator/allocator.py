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
* Item changes are debounced (`SolveDebounce`): a burst of applies is solved once it pauses
  for `solve_quiet`, or every `solve_max_delay` while it lasts (longer if solves take more
  than `SOLVE_MAX_DUTY` of that time); a lone change, and any
  member or limit change, is solved at once. Until then rounds converge towards the previous
  solution (new items wait; a departed member is never in a solution rounds act on).
* While a solve waits (debounced) and the leader's last round wrote nothing, it runs no
  rounds until the solve is due or the members change (their keys' mod revisions): such a
  round, linear in all the items, would converge towards the solution it already reached,
  once per revision of the burst. Progress that waits on other writes meanwhile (a route
  advertised, a lease expired) waits for the solve, at most the debounce's delay.
* Problems of `SOLVE_IN_PROCESS_ITEMS` items or more are solved in a child process
  (`SolverProcess`, started on the first such solve and ended when the member stops leading
  or `allocate` returns, raises or is cancelled), so the event loop serves meanwhile; if the child fails, the solve runs in a
  thread instead. Extracting the State and converging yield to the loop whenever they have
  held it for `state.HOLD_AT_MOST` (25 ms).
* A round during which the keyspace moved on is followed by a catch-up: the next round waits
  until the keyspace stayed unchanged for `ROUND_QUIET`, at most `ROUND_CATCH_UP_MAX` or, if
  longer, the round's own duration times (1 - `ROUND_MAX_DUTY`) / `ROUND_MAX_DUTY`. So rounds
  follow the watch's backlog in one step instead of one round per few revisions, and while
  the keyspace keeps moving they take at most about `ROUND_MAX_DUTY` of the leader's time: a
  round at 40,000 journals takes about a second, and with a one-second catch-up the leader
  trailed etcd by 30 s while the primaries advertised their routes. After a round that left
  new items to the next (`Counters.deferred`), the catch-up is `ROUND_CATCH_UP_MAX` at most:
  the next wave is not held up by the last one's route writes.
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
from .debounce import Clock, SolveDebounce
from .errors import MemberNotFoundError, SolverProcessError
from .keys import members_prefix
from .solve_process import SolverProcess
from .solver import Desired, Problem, desired_of, solve_problem
from .specs import desired_replication
from .state import EntryCache, IsConsistentFn, State, leader_view

log = logging.getLogger(__name__)

# Item count from which the solver runs in a child process rather than on the event loop
# (below it a solve takes tens of milliseconds: less than a round trip to the child).
SOLVE_IN_PROCESS_ITEMS = 1000
# Debounce of re-solves after item changes (see `SolveDebounce`), in seconds. A large apply
# is assigned once it ends, not while it streams in: assigning its first journals starts
# replicas, pulses and route writes on every broker, which share the cores with the apply
# (at 50,000 journals, solving at most 5 s into the burst made a 40,000-journal apply take
# 87 s, and every journal was assigned 20 s after it; waiting, 22 s and 44 s, in waves of
# `converge.NEW_ITEMS_PER_ROUND`). A new item waits at most SOLVE_MAX_DELAY while items keep
# changing.
SOLVE_QUIET = 0.5
SOLVE_MAX_DELAY = 30.0
# The largest share of a burst's time the leader spends solving (see `SolveDebounce`).
SOLVE_MAX_DUTY = 0.25
# After a round during which the keyspace moved on: how long it must stay unchanged (at most
# ROUND_CATCH_UP_MAX) before the next round, so the watch's backlog is applied first.
ROUND_QUIET = 0.05
ROUND_CATCH_UP_MAX = 1.0
# The largest share of a moving keyspace's time the leader spends in rounds (see `_catch_up`).
ROUND_MAX_DUTY = 0.25


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
    solve_quiet: float = SOLVE_QUIET,
    solve_max_delay: float = SOLVE_MAX_DELAY,
    clock: Clock = time.monotonic,
) -> None:
    """Runs the allocation loop until the local member may exit (see the module docstring)."""
    solver = SolverProcess()
    try:
        await _allocate(client, keyspace, local_member_key, is_consistent, on_round, max_txn_ops,
                        retry_interval, replication, SolveDebounce(solve_quiet, solve_max_delay, clock, SOLVE_MAX_DUTY),
                        solver)
    finally:
        await solver.close()


def _members_signature(keyspace: KeySpace) -> tuple[tuple[str, int], ...]:
    """The members' keys and mod revisions: a member joining, leaving or changing its limit
    or exiting flag changes it (a solve for those is urgent, never waited for)."""
    return tuple((kv.key, kv.mod_revision) for kv in keyspace.prefixed(members_prefix(keyspace.root)))


def catch_up_limit(held: float) -> float:
    """The longest catch-up after a round that held the leader for ``held`` seconds: rounds
    take at most `ROUND_MAX_DUTY` of the time while the keyspace keeps moving."""
    return max(ROUND_CATCH_UP_MAX, held * (1 - ROUND_MAX_DUTY) / ROUND_MAX_DUTY)


async def _catch_up(keyspace: KeySpace, quiet: float, at_most: float) -> None:
    """Waits until the keyspace has had no update for ``quiet`` seconds, or ``at_most``."""
    deadline = asyncio.get_running_loop().time() + at_most
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            await keyspace.wait_for_revision(keyspace.revision + 1, timeout=min(quiet, left))
        except TimeoutError:
            return


async def _solve(state: State, solver: SolverProcess) -> list[Desired]:
    problem = Problem.of(state)
    if len(problem.names) < SOLVE_IN_PROCESS_ITEMS:
        return desired_of(problem, solve_problem(problem))
    try:
        solution = await solver.solve(problem)
    except SolverProcessError as err:
        log.warning("solving in a thread instead: %s", err)
        solution = await asyncio.to_thread(solve_problem, problem)
    return desired_of(problem, solution)


async def _allocate(
    client: aetcd.Client,
    keyspace: KeySpace,
    local_member_key: str,
    is_consistent: IsConsistentFn,
    on_round: RoundHook | None,
    max_txn_ops: int,
    retry_interval: float,
    replication: Callable[[object], int],
    debounce: SolveDebounce,
    solver: SolverProcess,
) -> None:
    desired: list[Desired] = []
    solved_members: object = None  # the members half of the network key last solved
    round_number = 0
    cache = EntryCache()  # entries decoded in earlier rounds: a round decodes only what changed
    # While a solve is pending and the last round wrote nothing: until when rounds are skipped,
    # and the members they are skipped for (see `_members_signature`).
    resting_until: float | None = None
    resting_members: object = None

    while True:
        member, is_leader = leader_view(keyspace, local_member_key)
        if member is None:
            raise MemberNotFoundError(
                f"member key {local_member_key!r} is not in etcd (revision "
                f"{keyspace.revision}): was it announced, and is its lease alive?"
            )
        next_revision = keyspace.revision + 1
        timeout: float | None = None
        if not is_leader:
            await solver.close()  # a deposed leader's child would idle: a new leader starts its own
        # Taken before the round reads the keyspace: members that change while it runs differ
        # from it, and end the rest that follows.
        members_sig = _members_signature(keyspace)

        if resting_until is not None:
            rest = resting_until - time.monotonic()
            if (is_leader and not member.decoded.exiting and rest > 0
                    and members_sig == resting_members):
                # A burst of item changes: a round would converge towards the solution it
                # already reached, at a cost linear in all the items, once per revision (an
                # apply of 40,000 journals spent over a millisecond of the leader's CPU per
                # journal on such rounds). Wait for the solve instead.
                try:
                    await keyspace.wait_for_revision(next_revision, timeout=rest)
                except TimeoutError:
                    pass
                continue
            resting_until = None

        # Only the leader, or an exiting member deciding whether it may go, needs the full
        # (linear-time) State; other members just wait for the next update.
        state = None
        deferred = 0  # new items this round left to the next (see `converge`)
        round_started, solve_took = time.monotonic(), 0.0
        if is_leader or member.decoded.exiting:
            state = await State.from_keyspace_yielding(keyspace, local_member_key, is_consistent,
                                                       replication, cache)
            if state.should_exit:
                log.info("member %s is exiting and holds no assignments", local_member_key)
                return

        if state is not None and is_leader:
            members_key = state.network_key[0] if state.network_key else None
            wait = debounce.observe(state.network_key, urgent=members_key != solved_members)
            if wait is not None and wait > 0:
                timeout = wait  # converge towards the previous solution meanwhile
            elif wait is not None:
                started = time.monotonic()
                desired = await _solve(state, solver)
                solve_took = time.monotonic() - started
                debounce.solved(state.network_key, solve_took)
                solved_members = members_key
                log.info(
                    "solved for %d of %d item slots over %d members in %.3fs (revision %d)",
                    len(desired), state.item_slots, len(state.members), solve_took, state.revision,
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
                timeout = retry_interval if timeout is None else min(timeout, retry_interval)
            else:
                if on_round is not None:
                    on_round(Round(round_number, state.revision, txn.revision == 0, counters,
                                   len(desired), state.item_slots))
                round_number += 1
                deferred = counters.deferred
                if txn.revision == 0 and wait is not None and wait > 0:
                    resting_until, resting_members = time.monotonic() + wait, members_sig
            # Read through whatever was applied, even if a later transaction failed.
            next_revision = max(next_revision, txn.revision)

        log.debug("allocation round done at revision %d: waiting for revision %d (timeout %s)",
                  keyspace.revision, next_revision, timeout)
        if state is not None and is_leader and keyspace.revision >= next_revision:
            # Updates arrived while this round ran: let the keyspace catch up with its watch
            # before the next round. Each round is linear in the items, and rounds back to back
            # starve the watch: after a 5,000-journal apply at 10,000 journals the leader ran a
            # round per few watched revisions and trailed etcd by ~25 s at a full core.
            # The solve is not counted: the watch is applied while the child solves.
            held = time.monotonic() - round_started - solve_took
            await _catch_up(keyspace, ROUND_QUIET,
                            ROUND_CATCH_UP_MAX if deferred else catch_up_limit(held))
        try:
            await keyspace.wait_for_revision(next_revision, timeout=timeout)
        except TimeoutError:
            pass  # Retry the failed round against the (unchanged) keyspace.
