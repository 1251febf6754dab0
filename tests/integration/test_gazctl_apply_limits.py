"""``gazctl journals apply`` of more journals than one etcd transaction may hold (etcd's
--max-txn-ops, 128 by default) fails with one line that says to use ``--max-txn-size``, and
applies with it."""

from __future__ import annotations

from gazette.testing.cluster import Cluster

COUNT = 200


def _specs(count: int) -> str:
    children = "".join(f"- name: many/part-{i:04d}\n" for i in range(count))
    return ("name: many/\nreplication: 1\nlabels:\n- name: content-type\n"
            "  value: application/x-ndjson\nfragment:\n  length: 4096\n  compression_codec: NONE\n  stores:\n  - file:///\n"
            f"  refresh_interval: 1m0s\nchildren:\n{children}")


def test_too_large_an_apply_names_max_txn_size(cluster: Cluster) -> None:
    cluster.add_broker("local", "busy-walrus")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=_specs(COUNT))
    assert rc == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "too many operations in txn request" in err and "--max-txn-size" in err, err

    rc, _, err = cluster.gazctl("journals", "apply", "--max-txn-size", "50", stdin=_specs(COUNT))
    assert rc == 0, err
    rc, out, err = cluster.gazctl("journals", "list", "-l", "prefix=many/", "-o", "json")
    assert rc == 0, err
    assert out.count('"name":"many/part-') == COUNT
