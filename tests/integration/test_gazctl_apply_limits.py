"""``gazctl journals apply`` of more journals than one etcd transaction may hold (etcd's
--max-txn-ops, 128 by default): by default the apply is split into transactions etcd admits
and succeeds; ``--max-txn-size 0`` (one atomic transaction) is refused by etcd with one line
that names ``--max-txn-size``, and applies nothing."""

from __future__ import annotations

from gazette.testing.cluster import Cluster


def _specs(prefix: str, count: int) -> str:
    children = "".join(f"- name: {prefix}part-{i:04d}\n" for i in range(count))
    return (f"name: {prefix}\nreplication: 1\nlabels:\n- name: content-type\n"
            "  value: application/x-ndjson\nfragment:\n  length: 4096\n  compression_codec: NONE\n  stores:\n  - file:///\n"
            f"  refresh_interval: 1m0s\nchildren:\n{children}")


def _listed(cluster: Cluster, prefix: str) -> int:
    rc, out, err = cluster.gazctl("journals", "list", "-l", f"prefix={prefix}", "-o", "json")
    assert rc == 0, err
    return out.count(f'"name":"{prefix}part-')


def test_a_large_apply_is_split_by_default(cluster: Cluster) -> None:
    cluster.add_broker("local", "busy-walrus", extra_args=("--broker.limit", "4000"))
    rc, _, err = cluster.gazctl("journals", "apply", stdin=_specs("many/", 1000), timeout=240)
    assert rc == 0, err
    assert "transactions=8" in err, err  # 1,000 changes in transactions of 128
    assert _listed(cluster, "many/") == 1000


def test_an_atomic_apply_too_large_for_etcd_is_refused_with_the_hint(cluster: Cluster) -> None:
    cluster.add_broker("local", "busy-walrus")
    rc, _, err = cluster.gazctl("journals", "apply", "--max-txn-size", "0", stdin=_specs("one/", 200))
    assert rc == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "too many operations in txn request" in err and "--max-txn-size" in err, err
    assert "applied=" not in err, err  # one transaction: nothing applied before it
    assert _listed(cluster, "one/") == 0

    rc, _, err = cluster.gazctl("journals", "apply", "--max-txn-size", "50", stdin=_specs("one/", 200))
    assert rc == 0, err
    assert _listed(cluster, "one/") == 200


def test_a_split_apply_that_fails_part_way_says_what_stays_applied(cluster: Cluster) -> None:
    cluster.add_broker("local", "busy-walrus")
    # part-0120 claims a revision it does not have: its transaction (changes 100-149) fails.
    text = _specs("half/", 200).replace("- name: half/part-0120\n",
                                        "- name: half/part-0120\n  revision: 7\n")
    rc, _, err = cluster.gazctl("journals", "apply", "--max-txn-size", "50", stdin=text)
    assert rc == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "100 of 200 changes were applied by earlier transactions" in err, err
    assert _listed(cluster, "half/") == 100
