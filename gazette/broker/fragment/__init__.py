"""The broker's fragment layer: spools, fragments, the fragment index, stores and persistence.

* :mod:`.fragment` — :class:`Fragment` (content-addressed journal span) and :class:`CoverSet`.
* :mod:`.codecs` — streaming compressors of fragment files, Gazette's file extensions.
* :mod:`.spool` — :class:`Spool`, the replica's state machine over ReplicateRequests.
* :mod:`.index` — :class:`Index`, which fragment serves a read at an offset.
* :mod:`.store` — :class:`FragmentStore` protocol, :class:`FileStore`, the URL registry.
* :mod:`.persister` — :class:`Persister`, which uploads completed spools.
* :mod:`.errors` — the exception tree.
"""

from gazette.broker.fragment.codecs import (
    Codec,
    Compressor,
    Decompressor,
    codec_for_extension,
    extension,
    new_compressor,
    new_decompressor,
)
from gazette.broker.fragment.errors import (
    CodecError,
    ContentNameError,
    FragmentError,
    IndexClosedError,
    SpoolError,
    StoreAuthError,
    StoreError,
    StorePathError,
    TemplateError,
    UnsupportedStoreError,
)
from gazette.broker.fragment.fragment import (
    ZERO_SUM,
    CoverSet,
    File,
    Fragment,
    parse_content_name,
    sum_from_proto,
    sum_to_proto,
)
from gazette.broker.fragment.index import OFFSET_JUMP_AGE, Index
from gazette.broker.fragment.persister import Persister, eval_path_postfix
from gazette.broker.fragment.spool import Spool, SpoolFile, SpoolSnapshot
from gazette.broker.fragment.store import (
    FileStore,
    FragmentStore,
    Stores,
    register_store,
    store_for_url,
    walk_all_stores,
)

__all__ = [
    "OFFSET_JUMP_AGE",
    "ZERO_SUM",
    "Codec",
    "CodecError",
    "Compressor",
    "ContentNameError",
    "CoverSet",
    "Decompressor",
    "File",
    "FileStore",
    "Fragment",
    "FragmentError",
    "FragmentStore",
    "Index",
    "IndexClosedError",
    "Persister",
    "Spool",
    "SpoolError",
    "SpoolFile",
    "SpoolSnapshot",
    "StoreAuthError",
    "StoreError",
    "StorePathError",
    "Stores",
    "TemplateError",
    "UnsupportedStoreError",
    "codec_for_extension",
    "eval_path_postfix",
    "extension",
    "new_compressor",
    "new_decompressor",
    "parse_content_name",
    "register_store",
    "store_for_url",
    "sum_from_proto",
    "sum_to_proto",
    "walk_all_stores",
]
