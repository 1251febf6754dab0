"""gazette.etcd.txn.apply_changes against a real etcd: revision checks and atomicity."""

from __future__ import annotations

from gazette.etcd import txn
from gazette.testing.etcd import EtcdFixture


async def _get(etcd: EtcdFixture, key: str) -> tuple[bytes | None, int]:
    resp = await etcd.client.get(key.encode())
    if resp is None:
        return None, 0
    return resp.value, resp.mod_revision


async def test_apply_changes_checks_revisions_and_applies_atomically(etcd: EtcdFixture) -> None:
    a, b = f"{etcd.prefix}/items/a", f"{etcd.prefix}/items/b"
    # Create both, each expected absent (mod revision 0).
    resp = await txn.apply_changes(etcd.client, [txn.ItemChange(a, b"1", 0), txn.ItemChange(b, b"2", 0)])
    assert resp.succeeded
    (va, rev_a), (vb, _) = await _get(etcd, a), await _get(etcd, b)
    assert (va, vb) == (b"1", b"2") and rev_a == resp.header.revision

    # A stale expectation on one change applies nothing, including the other change.
    resp = await txn.apply_changes(etcd.client, [txn.ItemChange(a, None, rev_a), txn.ItemChange(b, b"3", rev_a - 1)])
    assert not resp.succeeded
    assert (await _get(etcd, a))[0] == b"1" and (await _get(etcd, b))[0] == b"2"

    # An extra comparison that fails also applies nothing; unchecked (-1) changes apply.
    resp = await txn.apply_changes(etcd.client, [txn.ItemChange(b, b"4")], [txn.Cmp(a, "mod", rev_a + 100)])
    assert not resp.succeeded
    resp = await txn.apply_changes(etcd.client, [txn.ItemChange(a, None, rev_a), txn.ItemChange(b, b"4")],
                                   [txn.Cmp(a, "mod", rev_a)])
    assert resp.succeeded
    assert (await _get(etcd, a))[0] is None and (await _get(etcd, b))[0] == b"4"
