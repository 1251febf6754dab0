"""The solver's child process: same answers as solving in-process, ended by its owner
(also when cancelled), and a failed child is reported, then replaced."""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import signal
import struct

import pytest

from gazette.allocator.errors import SolverProcessError
from gazette.allocator.solve_process import SolverProcess, serve
from gazette.allocator.solver import Problem, desired_of, solve, solve_problem
from gazette.allocator.testing import build_state

pytestmark = pytest.mark.timeout(60)

MEMBERS = [("zone-a", "m1", 100), ("zone-a", "m2", 100), ("zone-b", "m3", 100)]


def problem(n_items: int, limit: int = 100) -> Problem:
    members = [(z, s, limit) for z, s, _ in MEMBERS]
    return Problem.of(build_state([(f"item-{i:05d}", 2) for i in range(n_items)], members))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_answers_as_the_in_process_solver_and_close_ends_the_child() -> None:
    solver = SolverProcess()
    assert solver.pid is None  # started lazily
    state = build_state([(f"item-{i:02d}", 1 + i % 3) for i in range(40)], MEMBERS,
                        [("item-01", "zone-a", "m1", 0)])
    p = Problem.of(state)
    try:
        assert desired_of(p, await solver.solve(p)) == solve(state)
        pid = solver.pid
        assert pid is not None
        assert await solver.solve(p) == solve_problem(p)
        assert solver.pid == pid  # one child serves many solves
    finally:
        await solver.close()
    assert solver.pid is None and gone(pid)
    await solver.close()  # idempotent


async def test_cancelling_a_solve_kills_the_child() -> None:
    solver = SolverProcess()
    await solver.solve(problem(5))
    pid = solver.pid
    assert pid is not None
    task = asyncio.create_task(solver.solve(problem(20000, limit=20000)))  # a second of solving
    await asyncio.sleep(0)  # one step of the task: it sends, then awaits the answer
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert solver.pid is None and gone(pid)


async def test_a_failing_solve_is_reported_and_the_child_serves_on() -> None:
    solver = SolverProcess()
    try:
        bad = Problem(names=["a"], replication=[1], members=[("z", "m", 1)], current=[],
                      item_slots=1, member_slots=1)  # no current entry for item 0
        with pytest.raises(SolverProcessError, match="IndexError"):
            await solver.solve(bad)
        pid = solver.pid
        assert await solver.solve(problem(5)) == solve_problem(problem(5))
        assert solver.pid == pid
    finally:
        await solver.close()


async def test_a_killed_child_costs_at_most_one_failed_solve() -> None:
    solver = SolverProcess()
    try:
        await solver.solve(problem(5))
        pid = solver.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        try:
            first = await solver.solve(problem(5))
        except SolverProcessError:
            first = await solver.solve(problem(5))
        assert first == solve_problem(problem(5))
        assert solver.pid not in (None, pid)
    finally:
        await solver.close()


def test_serve_answers_each_problem_until_its_input_ends() -> None:
    length = struct.Struct("!Q")
    requests = b""
    problems = [problem(3), problem(7)]
    for p in problems:
        payload = pickle.dumps(p)
        requests += length.pack(len(payload)) + payload
    out = io.BytesIO()
    serve(io.BytesIO(requests), out)
    answers, data = [], out.getvalue()
    while data:
        (size,) = length.unpack(data[:length.size])
        answers.append(pickle.loads(data[length.size:length.size + size]))
        data = data[length.size + size:]
    assert answers == [solve_problem(p) for p in problems]
