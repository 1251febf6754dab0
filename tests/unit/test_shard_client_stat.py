"""ShardClient.stat asks again when the shard stopped while the Stat waited (a handoff), and
only then."""

from __future__ import annotations

from typing import Any

import pytest

from gazette.consumer import client as client_mod
from gazette.consumer.client import ShardClient, ShardStatusError
from gazette.protocol import consumer_pb2 as pc


class Scripted(ShardClient):
    def __init__(self, statuses: list[int]) -> None:
        super().__init__("http://127.0.0.1:1")
        self.statuses, self.calls = statuses, 0

    async def _call(self, method: str, req: Any, endpoint: str | None = None) -> Any:
        status = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        if status != pc.Status.OK:
            raise ShardStatusError(status, method)
        return pc.StatResponse(status=pc.Status.OK, read_through=dict(req.read_through))


async def test_stopped_then_served_elsewhere() -> None:
    sc = Scripted([pc.Status.SHARD_STOPPED, pc.Status.SHARD_STOPPED, pc.Status.OK])
    resp = await sc.stat("s", read_through={"j": 5})
    assert sc.calls == 3 and dict(resp.read_through) == {"j": 5}


@pytest.mark.parametrize("status", [pc.Status.SHARD_NOT_FOUND, pc.Status.NO_SHARD_PRIMARY])
async def test_other_statuses_are_not_retried(status: int) -> None:
    sc = Scripted([status, pc.Status.OK])
    with pytest.raises(ShardStatusError) as err:
        await sc.stat("s")
    assert err.value.status == status and sc.calls == 1


async def test_gives_up_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "STAT_RETRY_SECONDS", 0.3)
    sc = Scripted([pc.Status.SHARD_STOPPED])
    with pytest.raises(ShardStatusError) as err:
        await sc.stat("s")
    assert err.value.status == pc.Status.SHARD_STOPPED and 2 <= sc.calls <= 6
