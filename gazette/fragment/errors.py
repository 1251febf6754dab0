"""Errors of the fragment layer.

::

    FragmentError                   base of everything raised here
    ├── ContentNameError            a fragment file name does not parse (also a ValueError)
    ├── CodecError                  unknown codec or a corrupt / truncated compressed stream
    ├── SpoolError                  a ReplicateRequest that cannot apply to a spool (caller's fault)
    ├── StoreError                  a fragment store failed or is misconfigured
    │   ├── UnsupportedStoreError   no store for this URL scheme (yet)
    │   ├── StorePathError          a path would escape the store's root
    │   └── StoreAuthError          the store refused us (permissions, missing root directory)
    ├── TemplateError               a journal's path_postfix_template cannot be evaluated
    └── IndexClosedError            a blocked index query was released by Index.close()
"""

from __future__ import annotations

from gazette.errors import GazetteError

__all__ = [
    "CodecError",
    "ContentNameError",
    "FragmentError",
    "IndexClosedError",
    "SpoolError",
    "StoreAuthError",
    "StoreError",
    "StorePathError",
    "TemplateError",
    "UnsupportedStoreError",
]


class FragmentError(GazetteError):
    """Base of all errors of the fragment layer."""


class ContentNameError(FragmentError, ValueError):
    """A fragment content name or relative path is malformed."""


class CodecError(FragmentError):
    """A compression codec is unknown, or compressed content is corrupt or truncated."""


class SpoolError(FragmentError):
    """A ReplicateRequest is invalid for the spool it was applied to."""


class StoreError(FragmentError):
    """A fragment store operation failed."""


class UnsupportedStoreError(StoreError):
    """No fragment store implementation exists for a URL (scheme)."""


class StorePathError(StoreError):
    """A fragment path is not a safe relative path beneath the store's root."""


class StoreAuthError(StoreError):
    """The store denied access; on shutdown the persister falls back to the next store."""


class TemplateError(FragmentError):
    """A JournalSpec's fragment path_postfix_template cannot be evaluated."""


class IndexClosedError(FragmentError):
    """The index was closed while a query was blocked on it (the journal's replica stopped
    here, as it moves to another broker): transient, the reader retries elsewhere."""

    grpc_code = "UNAVAILABLE"
