"""gazette.testing.eventually: the one polling helper (async and sync forms)."""

from __future__ import annotations

import pytest

from gazette.testing.eventually import NotMetError, eventually, eventually_sync


async def test_returns_the_first_truthy_result_of_a_plain_predicate() -> None:
    calls = iter([None, 0, "", "found", "later"])
    assert await eventually(lambda: next(calls), "a value", interval=0) == "found"
    assert next(calls) == "later"  # polling stopped at the first truthy result


async def test_awaits_an_async_predicate() -> None:
    seen: list[int] = []

    async def cond() -> int | None:
        seen.append(len(seen))
        return len(seen) if len(seen) == 3 else None

    assert await eventually(cond, "three polls", interval=0) == 3
    assert seen == [0, 1, 2]


async def test_a_condition_never_met_fails_naming_it_after_one_last_poll() -> None:
    calls: list[None] = []

    def never() -> bool:
        calls.append(None)
        return False

    with pytest.raises(NotMetError, match=r"the moon turns blue: not met within 0s") as err:
        await eventually(never, "the moon turns blue", 0)
    assert isinstance(err.value, AssertionError) and isinstance(err.value, TimeoutError)
    assert len(calls) == 1  # a deadline already passed still polls once


def test_sync_form_returns_or_fails_the_same_way() -> None:
    calls = iter([False, False, 7])
    assert eventually_sync(lambda: next(calls), "seven", interval=0) == 7
    with pytest.raises(NotMetError, match="nothing: not met within 0s"):
        eventually_sync(lambda: None, "nothing", 0)
