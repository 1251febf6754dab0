"""gazctl journals prune's removal of one fragment: the fragment store named by the fragment's
backing_store (under --file-root for file://) removes exactly that fragment. The command loads
the store registry lazily, so this is also what checks that import resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_filestore import make_snapshot

from gazette.cli.gazctl.journals.prune import remove_fragment
from gazette.fragment import StoreError
from gazette.fragment.stores import FileStore


async def test_remove_fragment_removes_that_fragment_from_its_store(tmp_path: Path) -> None:
    store = FileStore("file:///", str(tmp_path))
    old = await store.persist(make_snapshot("a/journal", 0, b"old\n" * 100))
    new = await store.persist(make_snapshot("a/journal", 400, b"new\n" * 100))

    await remove_fragment(old.to_proto(), str(tmp_path))

    assert await store.list("a/journal") == [new]
    with pytest.raises(StoreError):  # gone: removing it again fails
        await remove_fragment(old.to_proto(), str(tmp_path))
