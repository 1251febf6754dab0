"""``apply_in_transactions``: changes go in order, in transactions of at most the size (one
for size <= 0, one empty one for no changes), and a failure reports how many changes earlier
transactions applied."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.cli.gazctl.common import DEFAULT_MAX_TXN_SIZE, ApplyBatchError, apply_in_transactions


@given(count=st.integers(0, 600), size=st.integers(-1, 300))
async def test_batches_cover_the_changes_in_order(count: int, size: int) -> None:
    sent: list[list[int]] = []

    async def send(batch: Sequence[int]) -> int:
        sent.append(list(batch))
        return len(sent)

    last, txns = await apply_in_transactions(list(range(count)), size, send)
    assert [c for batch in sent for c in batch] == list(range(count))
    assert txns == len(sent) == last
    limit = size if size > 0 else max(count, 1)
    assert all(1 <= len(b) <= limit for b in sent) or (count == 0 and sent == [[]])
    assert len(sent) == max(1, -(-count // limit))


async def test_a_failure_says_what_earlier_transactions_applied() -> None:
    async def send(batch: Sequence[int]) -> None:
        if 300 in batch:
            raise RuntimeError("refused")

    with pytest.raises(ApplyBatchError) as info:
        await apply_in_transactions(list(range(1000)), DEFAULT_MAX_TXN_SIZE, send)
    assert info.value.applied == 2 * DEFAULT_MAX_TXN_SIZE  # 300 is in the third transaction
    assert str(info.value.cause) == "refused"


def test_the_default_fits_a_default_etcd() -> None:
    # Each change is one operation and at most one comparison; etcd admits 128 of each.
    assert 0 < DEFAULT_MAX_TXN_SIZE <= 128
