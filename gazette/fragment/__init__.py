"""Fragments: content-addressed spans of a journal, their names and their codecs.

Below the client and the broker (Gazette keeps ``broker/codecs`` and the fragment type as
leaves the client imports): reading a compressed fragment loads nothing of the broker.
Importing this package loads none of :mod:`.stores` (the fragment stores, which import the
modules here and never the reverse).

* :mod:`.fragment` — :class:`Fragment` and :class:`CoverSet`, content names and SHA1 sums.
* :mod:`.codecs` — streaming (de)compressors, Gazette's file extensions.
* :mod:`.errors` — the fragment layer's exception tree (fragments, codecs, spools, stores).
* :mod:`.stores` — fragment stores: the protocol and registry, ``file://`` and ``s3://``.
"""

from gazette.fragment.codecs import (
    Codec,
    Compressor,
    Decompressor,
    codec_for_extension,
    extension,
    new_compressor,
    new_decompressor,
)
from gazette.fragment.errors import (
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
from gazette.fragment.fragment import (
    ZERO_SUM,
    CoverSet,
    File,
    Fragment,
    parse_content_name,
    set_sum,
    sum_from_proto,
    sum_to_proto,
)

__all__ = [
    "ZERO_SUM",
    "Codec",
    "CodecError",
    "Compressor",
    "ContentNameError",
    "CoverSet",
    "Decompressor",
    "File",
    "Fragment",
    "FragmentError",
    "IndexClosedError",
    "SpoolError",
    "StoreAuthError",
    "StoreError",
    "StorePathError",
    "TemplateError",
    "UnsupportedStoreError",
    "codec_for_extension",
    "extension",
    "new_compressor",
    "new_decompressor",
    "parse_content_name",
    "sum_from_proto",
    "set_sum",
    "sum_to_proto",
]
