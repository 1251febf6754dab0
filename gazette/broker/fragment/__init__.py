"""The broker's side of fragments: spools, the fragment index, persistence and store health.

Fragments, names and codecs are the leaf :mod:`gazette.fragment`; stores are
:mod:`gazette.stores`.

* :mod:`.spool` — :class:`Spool`, the replica's state machine over ReplicateRequests.
* :mod:`.index` — :class:`Index`, which fragment serves a read at an offset.
* :mod:`.persister` — :class:`Persister`, which uploads completed spools.
* :mod:`.health` — :class:`StoreHealth`, each store's cached health check.
"""

from gazette.broker.fragment.index import OFFSET_JUMP_AGE, Index
from gazette.broker.fragment.persister import Persister, eval_path_postfix
from gazette.broker.fragment.spool import Spool, SpoolFile, SpoolSnapshot

__all__ = [
    "OFFSET_JUMP_AGE",
    "Index",
    "Persister",
    "Spool",
    "SpoolFile",
    "SpoolSnapshot",
    "eval_path_postfix",
]
