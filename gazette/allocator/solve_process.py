"""`SolverProcess`: solves large allocation problems in a child process, off the event loop.

A solve is pure Python for seconds at tens of thousands of items. In a thread it still holds
the GIL the event loop needs: the leader's loop lagged past its etcd lease and the broker
exited. A child process has its own interpreter, so the loop only pickles the `Problem`
(plain lists, milliseconds) and awaits the answer on a pipe.

Invariants:

* The child is started by the first `solve` and ended by `close` (killed, then reaped), which
  its owner calls when it stops, cancelled or not. One solve runs at a time.
* Messages are length-prefixed pickles over the child's stdin and stdout. If an exchange is
  interrupted (cancellation, a crash, a malformed answer) the child is killed: the pipe may
  hold half a message. The next `solve` starts a fresh child.
* The child imports only this module, `solver`, `_flow` and the error modules (standard
  library otherwise), not
  the packages' `__init__`s with their etcd and gRPC clients, so it starts in tens of
  milliseconds and a few MiB. It exits when its stdin closes, so it never outlives its parent.
* Child failures raise `SolverProcessError`; the caller may then solve in-process.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
from typing import BinaryIO

from .errors import SolverProcessError
from .solver import Problem, Solution, solve_problem

_LEN = struct.Struct("!Q")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Runs in the child: stub the two packages so that importing this module skips their
# `__init__`s (see the module docstring), then serve.
_CHILD_CODE = """\
import os, sys, types
pkg_dir = sys.argv[1]
for name, path in (("gazette", os.path.dirname(pkg_dir)), ("gazette.allocator", pkg_dir)):
    stub = types.ModuleType(name)
    stub.__path__ = [path]
    sys.modules[name] = stub
from gazette.allocator.solve_process import serve
serve()
"""


class SolverProcess:
    """See the module docstring."""

    __slots__ = ("_proc",)

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (for observers and tests)."""
        return self._proc.pid if self._proc is not None else None

    async def solve(self, problem: Problem) -> Solution:
        """Solves `problem` in the child, starting it if it is not running."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            proc = self._proc = await self._start()
        assert proc.stdin is not None and proc.stdout is not None
        payload = pickle.dumps(problem, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            proc.stdin.write(_LEN.pack(len(payload)))
            proc.stdin.write(payload)
            await proc.stdin.drain()
            (size,) = _LEN.unpack(await proc.stdout.readexactly(_LEN.size))
            answer = pickle.loads(await proc.stdout.readexactly(size))  # noqa: S301 - our child
        except BaseException as err:
            await self.close()  # the pipe may hold half a message: start afresh next time
            if isinstance(err, (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError)):
                raise SolverProcessError(f"the solver process failed: {err!r}") from err
            raise
        if isinstance(answer, str):  # the child's solve raised: its traceback
            raise SolverProcessError(f"the solver process raised:\n{answer}")
        solution: Solution = answer
        return solution

    async def close(self) -> None:
        """Kills and reaps the child, if any (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        await proc.wait()

    @staticmethod
    async def _start() -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-c", _CHILD_CODE, _PACKAGE_DIR,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                start_new_session=True,  # the owner ends it, not a terminal's Ctrl-C
            )
        except OSError as err:
            raise SolverProcessError(f"cannot start the solver process: {err}") from err


def serve(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """The child's loop: answers each `Problem` with its `Solution` (or a traceback string)
    until stdin closes."""
    import traceback

    inp = stdin if stdin is not None else sys.stdin.buffer
    out = stdout if stdout is not None else sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the answers
    while True:
        header = inp.read(_LEN.size)
        if len(header) < _LEN.size:
            return  # the parent closed the pipe (or died)
        (size,) = _LEN.unpack(header)
        problem = pickle.loads(inp.read(size))  # noqa: S301 - our parent
        answer: Solution | str
        try:
            answer = solve_problem(problem)
        except Exception:
            answer = traceback.format_exc()
        payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(_LEN.pack(len(payload)))
        out.write(payload)
        out.flush()
