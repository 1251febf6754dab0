"""Min-cost maximum flow on a small integer network (primal-dual: Dijkstra + blocking flows).

The solver first maximises the flow from source to sink, and among all maximum flows returns
one of least total cost. Costs are non-negative integers (Python ints, so lexicographic
weights like K**3 are exact).

Invariants:

* Node potentials `h` keep every residual arc's reduced cost `cost + h[u] - h[v]` >= 0,
  so each phase's shortest-path search is a plain Dijkstra. Potentials are advanced by
  min(dist, dist[sink]), which keeps that property for nodes the search did not reach.
* Each phase then saturates the sub-network of zero reduced-cost arcs with Dinic blocking
  flows. The number of phases is bounded by the number of distinct shortest-path costs,
  which for the allocator's few cost tiers is small.
* The result is deterministic: arcs are examined in insertion order and heap ties break on
  node id.
* Written for mypyc (the compiled build compiles this module): every local is an `int` or a
  `list[int]`, "unreached" is -1 rather than None, and a heap entry is one int,
  ``dist * n + node``, which orders exactly as the tuple ``(dist, node)`` would.
"""

from __future__ import annotations

import heapq


class FlowNetwork:
    """A directed network of `n` nodes; arcs are added with `add_arc`."""

    __slots__ = ("n", "_adj", "_to", "_cap", "_cost")

    def __init__(self, n: int) -> None:
        self.n = n
        self._adj: list[list[int]] = [[] for _ in range(n)]
        self._to: list[int] = []
        self._cap: list[int] = []
        self._cost: list[int] = []

    def add_arc(self, u: int, v: int, cap: int, cost: int) -> int:
        """Adds arc u->v and its residual twin; returns the arc's id for `flow`."""
        assert cap >= 0 and cost >= 0, "capacities and costs are non-negative"
        e = len(self._to)
        self._to += (v, u)
        self._cap += (cap, 0)
        self._cost += (cost, -cost)
        self._adj[u].append(e)
        self._adj[v].append(e + 1)
        return e

    def flow(self, arc: int) -> int:
        """The flow carried by `arc` (the capacity of its residual twin)."""
        return self._cap[arc ^ 1]

    def solve(self, source: int, sink: int) -> tuple[int, int]:
        """Pushes a min-cost maximum flow; returns (flow, cost)."""
        n, adj, to, cap, cost = self.n, self._adj, self._to, self._cap, self._cost
        h = [0] * n
        total_flow = total_cost = 0

        while True:
            dist = [-1] * n  # reduced-cost distances are >= 0: -1 is "not reached"
            dist[source] = 0
            heap = [source]  # entries d * n + u (see the module docstring)
            while heap:
                d, u = divmod(heapq.heappop(heap), n)
                if d != dist[u]:
                    continue
                hu = h[u]
                for e in adj[u]:
                    if cap[e] > 0:
                        v = to[e]
                        nd = d + cost[e] + hu - h[v]
                        dv = dist[v]
                        if dv < 0 or nd < dv:
                            dist[v] = nd
                            heapq.heappush(heap, nd * n + v)
            dt = dist[sink]
            if dt < 0:
                return total_flow, total_cost
            for v in range(n):
                dv = dist[v]
                h[v] += dt if dv < 0 or dv > dt else dv

            pushed = self._blocking_flows(source, sink, h)
            total_flow += pushed
            total_cost += pushed * (h[sink] - h[source])

    def _blocking_flows(self, source: int, sink: int, h: list[int]) -> int:
        """Saturates the zero reduced-cost sub-network with Dinic phases."""
        n, adj, to, cap, cost = self.n, self._adj, self._to, self._cap, self._cost
        pushed = 0
        while True:
            level = [-1] * n
            level[source] = 0
            queue = [source]
            head = 0
            while head < len(queue):
                u = queue[head]
                head += 1
                hu, next_level = h[u], level[u] + 1
                for e in adj[u]:
                    v = to[e]
                    if level[v] < 0 and cap[e] > 0 and cost[e] + hu - h[v] == 0:
                        level[v] = next_level
                        queue.append(v)
            if level[sink] < 0:
                return pushed

            cursor = [0] * n
            path: list[int] = []
            u = source
            while True:
                if u == sink:
                    f = cap[path[0]]
                    for e in path:
                        if cap[e] < f:
                            f = cap[e]
                    for e in path:
                        cap[e] -= f
                        cap[e ^ 1] += f
                    pushed += f
                    path.clear()
                    u = source
                    continue
                arcs = adj[u]
                i = cursor[u]
                hu, next_level = h[u], level[u] + 1
                while i < len(arcs):
                    e = arcs[i]
                    v = to[e]
                    if level[v] == next_level and cap[e] > 0 and cost[e] + hu - h[v] == 0:
                        break
                    i += 1
                cursor[u] = i
                if i < len(arcs):
                    path.append(arcs[i])
                    u = to[arcs[i]]
                elif u == source:
                    break
                else:
                    level[u] = -1  # Dead end: prune it for the rest of this phase.
                    e = path.pop()
                    u = to[e ^ 1]
                    cursor[u] += 1
