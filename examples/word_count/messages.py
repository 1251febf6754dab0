"""word-count's names and its message: ``NGramCount`` deltas, fixed-framed protobuf."""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Sequence
from typing import Final

from examples.word_count import word_count_pb2 as wc
from gazette.errors import GazetteError
from gazette.message.uuid import UUID, ZERO_UUID

__all__ = ["DELTA_TYPE", "NGramCount", "WordCountError", "ngrams"]

DELTA_TYPE: Final = "word_count.NGramCount"


class WordCountError(GazetteError):
    """A word-count configuration or request error."""

    grpc_code = "INVALID_ARGUMENT"


class NGramCount:
    """A Gazette message around the protobuf ``NGramCount`` (its UUID in ``uuid``, 16 bytes)."""

    __slots__ = ("pb",)

    def __init__(self, n_gram: str = "", count: int = 0) -> None:
        self.pb = wc.NGramCount(n_gram=n_gram, count=count)

    def get_uuid(self) -> UUID:
        return uuid_mod.UUID(bytes=self.pb.uuid) if len(self.pb.uuid) == 16 else ZERO_UUID

    def set_uuid(self, uuid: UUID) -> None:
        self.pb.uuid = uuid.bytes

    def new_acknowledgement(self, journal: str) -> NGramCount:
        return NGramCount()

    def SerializeToString(self) -> bytes:  # noqa: N802 - what FixedFraming marshals
        return self.pb.SerializeToString()

    @classmethod
    def decode_many(cls, payloads: Sequence[bytes]) -> list[NGramCount]:
        out = []
        for p in payloads:
            m = cls()
            m.pb.ParseFromString(p)
            out.append(m)
        return out


def ngrams(text: str, n: int) -> list[str]:
    """The n-grams of ``text`` as Gazette's word-count makes them: lower-cased words (runs of
    letters), padded with ``START`` before and ``END`` after, joined by single spaces."""
    words, word = [], []
    for ch in text.lower():
        if ch.isalpha():
            word.append(ch)
        elif word:
            words.append("".join(word))
            word = []
    if word:
        words.append("".join(word))
    grams = ["START"] * n
    out = []
    for i in range(len(words) + n):
        grams = [*grams[1:], words[i] if i < len(words) else "END"]
        out.append(" ".join(grams))
    return out
