"""gazette.auth: Gazette's keyed tokens, claims and capabilities, and authorizing channels."""

from __future__ import annotations

import base64
from typing import Any

import jwt
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gazette import auth
from gazette.auth import BearerAuth, Claims, KeyedAuth, PermissionDenied, Unauthenticated
from gazette.protocol.labels import Label, LabelSelector, LabelSet

SECRET, OTHER = "c2VjcmV0", "b3RoZXI="  # "secret", "other" (Gazette's own test keys)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_gazettes_keyed_auth_cases() -> None:
    clock = Clock()
    ka1 = KeyedAuth(f"{SECRET},{OTHER}", clock=clock)
    ka2 = KeyedAuth(f"{OTHER}, {SECRET}", clock=clock)
    kam = KeyedAuth("YXNkZg== AA==", clock=clock)
    header = ka1.authorization(Claims(auth.APPEND | auth.LIST, LabelSelector.parse("hi=there")), 3600)
    # Signed with one key, verified by another holding it.
    claims = ka2.verify(header, auth.APPEND)
    assert claims.selector == LabelSelector.parse("hi=there")
    assert claims.capability == auth.APPEND | auth.LIST
    with pytest.raises(PermissionDenied, match="missing required REPLICATE capability"):
        ka2.verify(header, auth.REPLICATE)
    with pytest.raises(Unauthenticated, match="(?i)signature"):
        kam.verify(header, auth.APPEND)
    # AA== lets a request without a token through.
    assert kam.verify(None, auth.READ).unrestricted
    with pytest.raises(Unauthenticated, match="missing"):
        ka1.verify(None, auth.READ)
    with pytest.raises(Unauthenticated, match="Bearer"):
        ka1.verify("Basic dXNlcjpwYXNz", auth.READ)


@pytest.mark.parametrize("keys", ["", "AA==", "not base64!", " , "])
def test_bad_keys_are_refused(keys: str) -> None:
    with pytest.raises(ValueError):
        KeyedAuth(keys)


def test_expiry_and_issue_time_follow_the_clock() -> None:
    clock = Clock()
    ka = KeyedAuth(SECRET, clock=clock)
    header = ka.authorization(Claims(auth.READ), 60)
    assert ka.verify(header, auth.READ).capability == auth.READ  # now cached
    clock.now += 60 + auth.LEEWAY - 1
    ka.verify(header, auth.READ)  # within the leeway
    clock.now += 2
    with pytest.raises(Unauthenticated, match="expired"):
        ka.verify(header, auth.READ)  # the cache does not outlive the token
    early = KeyedAuth(SECRET, clock=Clock(clock.now + 3600)).authorization(Claims(auth.READ), 60)
    with pytest.raises(Unauthenticated, match="before issued"):
        ka.verify(early, auth.READ)


@pytest.mark.parametrize("alg", ["none", "HS512"])
def test_only_hs256_and_hs384_are_accepted(alg: str) -> None:
    ka = KeyedAuth(SECRET, clock=Clock())
    body = {"cap": auth.ALL, "iat": 1_800_000_000, "exp": 1_800_003_600}
    tok = jwt.encode(body, None if alg == "none" else b"secret", algorithm=alg)
    with pytest.raises(Unauthenticated):
        ka.verify(f"Bearer {tok}", auth.READ)
    ok = jwt.encode(body, b"secret", algorithm="HS384")
    assert ka.verify(f"Bearer {ok}", auth.READ).capability == auth.ALL


@pytest.mark.parametrize("body", [
    {"cap": 8, "iat": 1_800_000_000},  # no exp
    {"cap": "eight", "iat": 1_800_000_000, "exp": 1_800_003_600},
    {"cap": 8, "sel": {"include": {"labels": [{"name": "bad name!", "value": "x"}]}},
     "iat": 1_800_000_000, "exp": 1_800_003_600},
    {"cap": 8, "sel": "prefix=a/", "iat": 1_800_000_000, "exp": 1_800_003_600},
    {"cap": -1, "iat": 1_800_000_000, "exp": 1_800_003_600},
])
def test_malformed_claims_are_unauthenticated(body: dict[str, Any]) -> None:
    tok = jwt.encode(body, b"secret", algorithm="HS256")
    with pytest.raises(Unauthenticated):
        KeyedAuth(SECRET, clock=Clock()).verify(f"Bearer {tok}", auth.READ)


def test_gazettes_json_of_an_empty_selector() -> None:
    """Go marshals empty label lists as null."""
    body = {"cap": auth.READ, "sel": {"include": {"labels": None}, "exclude": {"labels": None}},
            "iat": 1_800_000_000, "exp": 1_800_003_600, "sub": "someone"}
    tok = jwt.encode(body, b"secret", algorithm="HS256")
    claims = KeyedAuth(SECRET, clock=Clock()).verify(f"Bearer {tok}", auth.READ)
    assert claims.unrestricted and claims.capability == auth.READ


names = st.sampled_from(["app", "name", "prefix", "id", "content-type"])
values = st.text(alphabet="abc/-.", min_size=1, max_size=6)
labels = st.lists(st.builds(Label, names, values, st.booleans()), max_size=4)


@settings(max_examples=200, deadline=None)
@given(labels, labels, st.integers(0, auth.ALL))
def test_claims_round_trip(include: list[Label], exclude: list[Label], cap: int) -> None:
    sel = LabelSelector(LabelSet(include), LabelSet(exclude))
    try:
        sel.validate()
    except ValueError:
        assume(False)  # only valid selectors are signed
    ka = KeyedAuth(SECRET, clock=Clock())
    claims = ka.verify(ka.authorization(Claims(cap, sel), 60), 0)
    assert (claims.capability, claims.selector) == (cap, sel)


def test_scope_matches_meta_labels() -> None:
    from gazette.protocol.labels import with_meta_labels, with_shard_meta_labels

    claims = Claims(auth.ALL, LabelSelector.parse("prefix=a/"))
    assert claims.permits(with_meta_labels(LabelSet(), "a/b/c"))
    assert not claims.permits(with_meta_labels(LabelSet(), "b/c"))
    shard = Claims(auth.ALL, LabelSelector.parse("id:prefix=mine-"))
    assert shard.permits(with_shard_meta_labels(LabelSet(), "mine-1"))
    assert not shard.permits(with_shard_meta_labels(LabelSet(), "theirs-1"))


class _FakeChannel:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def _mc(self, method: str, *args: Any, **kw: Any) -> Any:
        def call(*a: Any, metadata: Any = None, **k: Any) -> None:
            self.calls.append((method, metadata))
        return call

    unary_unary = unary_stream = stream_unary = stream_stream = _mc

    async def close(self, grace: float | None = None) -> None:
        pass


def test_authorized_channels_sign_each_method_for_its_capability() -> None:
    inner = _FakeChannel()
    keyed = KeyedAuth(SECRET)
    channel: Any = auth.authorized(lambda target, options: inner, keyed)("host:1", [])
    channel.unary_stream("/protocol.Journal/Read")(object())
    channel.stream_unary("/protocol.Journal/Append")(metadata=[("x-route", "1")])
    channel.unary_stream("/protocol.Journal/Read")(object())
    (m1, md1), (m2, md2), (_, md3) = inner.calls
    assert keyed.verify(dict(md1)["authorization"], auth.READ)
    with pytest.raises(PermissionDenied):
        keyed.verify(dict(md1)["authorization"], auth.APPEND)
    assert ("x-route", "1") in md2 and keyed.verify(dict(md2)["authorization"], auth.APPEND)
    assert md3 == md1  # signed once per capability, reused
    bearer: Any = auth.authorize_channel(_FakeChannel(), BearerAuth(" tok "))
    bearer.unary_unary("/app.Custom/Do")(object())
    assert bearer._inner.calls == [("/app.Custom/Do", [("authorization", "Bearer tok")])]
    assert auth.authorize_channel(inner, None) is inner


def test_capability_names() -> None:
    assert auth.capability_names(auth.LIST | auth.READ) == "LIST|READ"
    assert auth.capability_names(auth.ALL) == "ALL"
    assert auth.capability_names(1 << 16) == "0x10000"
    assert base64.b64decode(SECRET) == b"secret"
