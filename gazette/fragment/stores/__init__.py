"""Fragment stores: where completed fragments are persisted, listed, read and removed.

The protocol, registry and helpers are in :mod:`.base`; backends are :mod:`.file`
(``file://``, always available) and :mod:`.s3` (``s3://``, the ``s3`` extra: boto3, imported on
first use). Importing this package loads no backend dependency; the broker, gazctl, and
(next) recovery-log playback and Spark all read fragments through it.
"""

from gazette.fragment.stores.base import (
    Content,
    FragmentStore,
    StoreFactory,
    Stores,
    read_stored,
    register_store,
    store_for_url,
    walk_all_stores,
)
from gazette.fragment.stores.file import FileStore

register_store("file", FileStore)
register_store("s3", "gazette.fragment.stores.s3:S3Store", extra="s3")

__all__ = [
    "Content",
    "FileStore",
    "FragmentStore",
    "StoreFactory",
    "Stores",
    "read_stored",
    "register_store",
    "store_for_url",
    "walk_all_stores",
]
