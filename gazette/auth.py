"""Bearer-token capabilities, as Gazette's ``auth`` package: who may do what to which items.

A request carries ``authorization: Bearer <JWT>`` (gRPC metadata, or the HTTP header). The
token's claims are Gazette's: ``cap`` (a bit mask of capabilities), ``sel`` (a label
selector scoping them: a journal or shard the selector does not match is, to this token, a
journal or shard that does not exist), ``exp`` and ``iat``. Tokens are HS256-signed with
pre-shared keys (``--auth-keys``: base64, separated by whitespace or commas); the first key
signs, any key verifies; the special key ``AA==`` lets requests without a token through
(with every capability, for rolling authorization out on a running cluster).

Roles, as Gazette's interfaces: a :class:`Verifier` checks an incoming request's token for a
capability and returns its :class:`Claims`; an :class:`Authorizer` gives the header an
outgoing request carries (:class:`KeyedAuth` signs one, :class:`BearerAuth` passes a token it
was given). :func:`authorized` wraps a channel factory so that every call carries a token for
the capability its method needs.

Invariants:

* Verification requires ``exp``, checks ``iat``, allows 5 s of clock skew, and accepts only
  HS256 and HS384 (no ``none``, no algorithm confusion).
* A request without a valid token is refused ``UNAUTHENTICATED`` (401); a valid token lacking
  the capability ``PERMISSION_DENIED`` (403) naming it. Neither runs any of the request.
* Verified tokens are cached until they expire (clients reuse a token for its lifetime), so
  verifying costs a dictionary lookup per request after the first.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any, Protocol

from gazette.errors import GazetteError
from gazette.protocol.labels import Label, LabelSelector, LabelSet
from gazette.rpc.seam import ChannelFactory, RpcChannel

__all__ = [
    "ALL", "APPEND", "APPLY", "LIST", "READ", "REPLICATE", "AuthError", "Authorizer",
    "BearerAuth", "Claims", "KeyedAuth", "NO_AUTH", "PermissionDenied", "Unauthenticated",
    "Verifier", "authorize_channel", "authorized", "capability_names", "method_capability", "token_of",
]

log = logging.getLogger(__name__)

LIST = 1 << 1
APPLY = 1 << 2
READ = 1 << 3
APPEND = 1 << 4
REPLICATE = 1 << 5
ALL = 0xFFFFFFFF
"""Gazette's capability bits (applications may use bits from ``1 << 16``)."""

_NAMES = {LIST: "LIST", APPLY: "APPLY", READ: "READ", APPEND: "APPEND", REPLICATE: "REPLICATE"}

ALLOW_MISSING_KEY = "AA=="
LEEWAY = 5.0  # seconds of clock skew tolerated on exp and iat
_CACHE_SIZE = 4096

# The capability each RPC needs, as Gazette's Auth*Client sign and Verified*Server check.
_METHOD_CAPABILITY = {
    "/protocol.Journal/List": LIST,
    "/protocol.Journal/Apply": APPLY,
    "/protocol.Journal/Read": READ,
    "/protocol.Journal/Append": APPEND,
    "/protocol.Journal/Replicate": REPLICATE,
    "/protocol.Journal/ListFragments": READ,
    # Our brokers ask APPLY (it makes them dial and write a store the caller names), Gazette's
    # READ: a token with both serves either.
    "/protocol.Journal/FragmentStoreHealth": READ | APPLY,
    "/consumer.Shard/Stat": READ,
    "/consumer.Shard/List": LIST,
    "/consumer.Shard/Apply": APPLY,
    "/consumer.Shard/GetHints": READ,
    "/consumer.Shard/Unassign": APPLY,
}


def method_capability(path: str) -> int:
    """The capability an RPC ``path`` needs (an application's own methods: ``ALL``)."""
    return _METHOD_CAPABILITY.get(path, ALL)


def capability_names(cap: int) -> str:
    """``LIST|READ`` for a mask (``ALL`` for every bit)."""
    if cap == ALL:
        return "ALL"
    names = [name for bit, name in _NAMES.items() if cap & bit]
    rest = cap & ~sum(_NAMES)
    if rest:
        names.append(hex(rest))
    return "|".join(names) or "none"


class AuthError(GazetteError):
    """A request is not authorized."""

    grpc_code = "UNAUTHENTICATED"
    http_status = 401


class Unauthenticated(AuthError):
    """No token, a malformed or badly signed one, or an expired one."""


class PermissionDenied(AuthError):
    """A valid token that lacks the capability a request needs."""

    grpc_code = "PERMISSION_DENIED"
    http_status = 403


def _selector_json(sel: LabelSelector) -> dict[str, Any]:
    def labels(ls: LabelSet) -> dict[str, Any]:
        out = []
        for lb in ls:
            d: dict[str, Any] = {"name": lb.name, "value": lb.value}
            if lb.prefix:
                d["prefix"] = True
            out.append(d)
        return {"labels": out}
    return {"include": labels(sel.include), "exclude": labels(sel.exclude)}


def _selector_of(obj: Any) -> LabelSelector:
    """Gazette's JSON of a LabelSelector (``null`` lists and missing sets allowed)."""
    if obj is None:
        return LabelSelector()
    if not isinstance(obj, dict):
        raise ValueError("sel is not an object")

    def labels(key: str) -> LabelSet:
        part = obj.get(key) or {}
        if not isinstance(part, dict):
            raise ValueError(f"sel.{key} is not an object")
        items = part.get("labels") or []
        if not isinstance(items, list):
            raise ValueError(f"sel.{key}.labels is not a list")
        out = []
        for item in items:
            if not isinstance(item, dict):
                raise ValueError(f"sel.{key}.labels holds a non-object")
            out.append(Label(str(item.get("name", "")), str(item.get("value", "")),
                             bool(item.get("prefix", False))))
        return LabelSet(out)
    sel = LabelSelector(labels("include"), labels("exclude"))
    sel.validate()
    return sel


@dataclass(frozen=True)
class Claims:
    """What a token grants: ``capability`` on the items ``selector`` matches, until ``expires``
    (Unix seconds)."""

    capability: int
    selector: LabelSelector = field(default_factory=LabelSelector)
    expires: float = 0.0
    issued: float = 0.0

    @cached_property  # read for every append's resolution: after the first, a dict hit
    def unrestricted(self) -> bool:
        """Whether the selector matches every item."""
        return not self.selector.include and not self.selector.exclude

    def permits(self, labels: LabelSet) -> bool:
        """Whether an item with ``labels`` (its meta-labels included) is in scope."""
        return self.unrestricted or self.selector.matches(labels)

    def to_json(self) -> dict[str, Any]:
        return {"cap": self.capability, "sel": _selector_json(self.selector),
                "iat": int(self.issued), "exp": int(self.expires)}


class Verifier(Protocol):
    """Checks an incoming request's ``authorization`` value (None: absent) for ``require``."""

    def verify(self, authorization: str | None, require: int) -> Claims: ...


class Authorizer(Protocol):
    """The ``authorization`` value for an outgoing request needing ``claims``."""

    def authorization(self, claims: Claims, ttl: float) -> str: ...


class NoAuth:
    """Authorization off: every request passes with the capability it needs on everything."""

    def __init__(self) -> None:
        self._claims: dict[int, Claims] = {}

    def verify(self, authorization: str | None, require: int) -> Claims:
        # One (frozen) Claims per capability, not one per request.
        claims = self._claims.get(require)
        if claims is None:
            claims = self._claims[require] = Claims(require)
        return claims

    def authorization(self, claims: Claims, ttl: float) -> str:
        return ""


NO_AUTH = NoAuth()


def _parse_keys(text: str) -> tuple[list[bytes], bool]:
    keys: list[bytes] = []
    allow_missing = False
    for i, key in enumerate(text.replace(",", " ").split()):
        if key == ALLOW_MISSING_KEY:
            allow_missing = True
            continue
        try:
            keys.append(base64.b64decode(key, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"auth key {i} is not valid base64") from None
    if not keys:
        raise ValueError("at least one auth key must be given (besides AA==)")
    return keys, allow_missing


def _jwt() -> ModuleType:
    """PyJWT, imported by the first KeyedAuth: it imports cryptography, a sixth of gazctl's
    start, which a process without keys never needs.

    PyJWT warns on every use of a key shorter than 32 bytes; Gazette's keys may be (its own
    tests' are 5 bytes). KeyedAuth says so once, when it is made, instead of once per request.
    PyJWT before 2.11 has no such warning (and does not warn), so its absence is not an error."""
    import jwt  # noqa: PLC0415 - see above
    import jwt.warnings  # noqa: PLC0415

    insecure: type[Warning] | None = getattr(jwt.warnings, "InsecureKeyLengthWarning", None)
    if insecure is not None:
        warnings.filterwarnings("ignore", category=insecure)
    return jwt


class KeyedAuth:
    """Signs (first key) and verifies (every key) tokens with pre-shared HS256 keys."""

    def __init__(self, keys: str, *, clock: Callable[[], float] = time.time) -> None:
        self.keys, self.allow_missing = _parse_keys(keys)
        short = [i for i, k in enumerate(self.keys) if len(k) < 32]
        if short:
            log.warning("auth keys shorter than 32 bytes (RFC 7518 recommends at least 32 for HS256)",
                        extra={"keys": short})
        self._clock = clock
        self._verified: OrderedDict[str, Claims] = OrderedDict()
        self._jwt = _jwt()

    def sign(self, claims: Claims, ttl: float) -> str:
        """A token for ``claims`` valid for ``ttl`` seconds from now."""
        now = self._clock()
        body = Claims(claims.capability, claims.selector, expires=now + ttl, issued=now).to_json()
        encoded: str = self._jwt.encode(body, self.keys[0], algorithm="HS256")
        return encoded

    def authorization(self, claims: Claims, ttl: float) -> str:
        return f"Bearer {self.sign(claims, ttl)}"

    def verify(self, authorization: str | None, require: int) -> Claims:
        if not authorization:
            if self.allow_missing:
                return Claims(ALL, expires=self._clock() + 3600)
            raise Unauthenticated("missing or empty Authorization token")
        if not authorization.startswith("Bearer "):
            raise Unauthenticated("invalid or unsupported Authorization header (expected 'Bearer')")
        token = authorization[7:]
        now = self._clock()
        claims = self._verified.get(token)
        if claims is None or claims.expires + LEEWAY < now:
            claims = self._decode(token, now)
            self._verified[token] = claims
            if len(self._verified) > _CACHE_SIZE:
                self._verified.popitem(last=False)
        if claims.capability & require != require:
            missing = require & ~claims.capability
            raise PermissionDenied(
                f"authorization is missing required {capability_names(missing)} capability")
        return claims

    def _decode(self, token: str, now: float) -> Claims:
        last: Exception | None = None
        for key in self.keys:
            try:
                body = self._jwt.decode(token, key, algorithms=["HS256", "HS384"], leeway=LEEWAY,
                                  options={"require": ["exp"], "verify_iat": False,
                                           "verify_exp": False})
                break
            except self._jwt.InvalidSignatureError as err:
                last = err
            except self._jwt.PyJWTError as err:
                raise Unauthenticated(f"verifying Authorization: {err}") from None
        else:
            raise Unauthenticated(f"verifying Authorization: {last}") from None
        # Expiry and issue time against our own (injectable) clock.
        try:
            exp, iat = float(body["exp"]), float(body.get("iat", 0) or 0)
            cap = int(body.get("cap", 0))
            sel = _selector_of(body.get("sel"))
        except (TypeError, ValueError, GazetteError) as err:
            raise Unauthenticated(f"verifying Authorization: malformed claims: {err}") from None
        if exp + LEEWAY < now:
            raise Unauthenticated("verifying Authorization: token has expired")
        if iat - LEEWAY > now:
            raise Unauthenticated("verifying Authorization: token used before issued")
        if not 0 <= cap <= ALL:
            raise Unauthenticated(f"verifying Authorization: malformed claims: cap {cap}")
        return Claims(cap, sel, expires=exp, issued=iat)


class BearerAuth:
    """Sends a token it was given (``BROKER_AUTH_TOKEN``), whatever the request."""

    def __init__(self, token: str) -> None:
        self.token = token.strip()

    def authorization(self, claims: Claims, ttl: float) -> str:
        return f"Bearer {self.token}"


def token_of(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The ``authorization`` value of gRPC ``metadata`` (None when absent)."""
    for key, value in metadata or ():
        if key == "authorization":
            return str(value)
    return None


# -- outgoing requests ------------------------------------------------------------------

_TTL = 3600.0
_RENEW = 300.0  # re-sign a cached token this long before it expires


class _Tokens:
    """Per-capability ``authorization`` values, re-signed shortly before they expire."""

    def __init__(self, authorizer: Authorizer, clock: Callable[[], float] = time.time) -> None:
        self._authorizer = authorizer
        self._clock = clock
        self._cache: dict[int, tuple[str, float]] = {}

    def header(self, capability: int) -> str:
        now = self._clock()
        hit = self._cache.get(capability)
        if hit is None or hit[1] - _RENEW < now:
            hit = (self._authorizer.authorization(Claims(capability), _TTL), now + _TTL)
            self._cache[capability] = hit
        return hit[0]


class _AuthorizedCallable:
    def __init__(self, inner: Any, tokens: _Tokens, capability: int) -> None:
        self._inner, self._tokens, self._capability = inner, tokens, capability

    def __call__(self, *args: Any, metadata: Sequence[tuple[str, str]] | None = None, **kw: Any) -> Any:
        header = self._tokens.header(self._capability)
        md = [*(metadata or ()), ("authorization", header)] if header else metadata
        return self._inner(*args, metadata=md, **kw)


class _AuthorizedChannel:
    """An :class:`~gazette.rpc.seam.RpcChannel` whose calls carry a token for their method's
    capability."""

    def __init__(self, inner: RpcChannel, tokens: _Tokens) -> None:
        self._inner, self._tokens = inner, tokens

    def _wrap(self, kind: str, method: str, *args: Any, **kw: Any) -> Any:
        mc = getattr(self._inner, kind)(method, *args, **kw)
        return _AuthorizedCallable(mc, self._tokens, method_capability(method))

    def unary_unary(self, method: str, *args: Any, **kw: Any) -> Any:
        return self._wrap("unary_unary", method, *args, **kw)

    def unary_stream(self, method: str, *args: Any, **kw: Any) -> Any:
        return self._wrap("unary_stream", method, *args, **kw)

    def stream_unary(self, method: str, *args: Any, **kw: Any) -> Any:
        return self._wrap("stream_unary", method, *args, **kw)

    def stream_stream(self, method: str, *args: Any, **kw: Any) -> Any:
        return self._wrap("stream_stream", method, *args, **kw)

    async def close(self, grace: float | None = None) -> None:
        await self._inner.close(grace)


def authorize_channel(channel: RpcChannel, authorizer: Authorizer | None) -> RpcChannel:
    """``channel``, its calls carrying ``authorizer``'s tokens (unchanged if None)."""
    if authorizer is None or isinstance(authorizer, NoAuth):
        return channel
    return _AuthorizedChannel(channel, _Tokens(authorizer))


def authorized(factory: ChannelFactory, authorizer: Authorizer | None) -> ChannelFactory:
    """``factory``, its channels' calls carrying ``authorizer``'s tokens (unchanged if None)."""
    if authorizer is None or isinstance(authorizer, NoAuth):
        return factory
    tokens = _Tokens(authorizer)

    def make(target: str, options: Sequence[tuple[str, Any]]) -> RpcChannel:
        return _AuthorizedChannel(factory(target, options), tokens)
    return make
