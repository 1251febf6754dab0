"""Go duration strings, as Gazette's YAML specs and flags spell them.

Gazette writes durations the way Go's ``time.Duration.String()`` prints them (``1m0s``,
``1h0m0s``, ``1.5s``, ``500ms``, ``10µs``, ``0s``) and reads them with
``time.ParseDuration`` (``5m``, ``1h30m``, ``.5h``, ``-2m3.5s``, ``1us``).

Invariants:

* The exact value is an integer count of nanoseconds in the signed 64-bit range, as in Go.
  :func:`parse_duration_ns` and :func:`format_duration_ns` work on that value and are exact
  inverses: ``parse_duration_ns(format_duration_ns(n)) == n`` for every int64 ``n``.
* :class:`datetime.timedelta` has microsecond resolution. The ``timedelta`` functions refuse
  (``ValueError``) values that would lose nanoseconds rather than round them silently.
* Fractions are applied with the same IEEE double arithmetic Go uses, so a fraction of an hour
  yields the same nanosecond count as Go would.
"""

from __future__ import annotations

from datetime import timedelta

from google.protobuf.duration_pb2 import Duration

__all__ = [
    "duration_from_pb",
    "duration_to_pb",
    "format_duration",
    "format_duration_ns",
    "ns_from_pb",
    "ns_to_pb",
    "parse_duration",
    "parse_duration_ns",
    "timedelta_from_ns",
    "timedelta_to_ns",
]

NANOSECOND = 1
MICROSECOND = 1000 * NANOSECOND
MILLISECOND = 1000 * MICROSECOND
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_MAX_NS = (1 << 63) - 1
_MIN_NS = -(1 << 63)

_UNITS: dict[str, int] = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # MICRO SIGN
    "\u03bcs": MICROSECOND,  # GREEK SMALL LETTER MU
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}

_DIGITS = frozenset("0123456789")


class _Invalid(Exception):
    """Internal: the text is not a duration; carries the reason."""


def _leading_int(s: str, i: int) -> tuple[int, int]:
    """Consume ASCII digits from ``s[i:]``; return (value, next index). Overflow is an error."""
    x = 0
    n = len(s)
    while i < n and s[i] in _DIGITS:
        # Go bounds the accumulator by 2**63 (room for the magnitude of the most negative int64).
        x = x * 10 + (ord(s[i]) - 48)
        if x > 1 << 63:
            raise _Invalid("overflows a 64-bit count of nanoseconds")
        i += 1
    return x, i


def _leading_fraction(s: str, i: int) -> tuple[int, float, int]:
    """Consume fractional digits; return (digits value, 10**digits kept, next index).

    Digits beyond what fits are consumed but ignored, exactly as Go does.
    """
    x = 0
    scale = 1.0
    overflow = False
    n = len(s)
    while i < n and s[i] in _DIGITS:
        if not overflow:
            if x > _MAX_NS // 10:
                overflow = True
            else:
                y = x * 10 + (ord(s[i]) - 48)
                if y > 1 << 63:
                    overflow = True
                else:
                    x = y
                    scale *= 10
        i += 1
    return x, scale, i


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string into integer nanoseconds.

    Accepts everything Go's ``time.ParseDuration`` accepts: an optional sign, then one or more
    ``<decimal><unit>`` terms (``1h30m``, ``1.5s``, ``.5m``, ``3.``), units ``ns``, ``us``,
    ``µs``, ``μs``, ``ms``, ``s``, ``m``, ``h``; and the bare ``0``.
    Raises ``ValueError`` naming the text and the reason otherwise.
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid duration {text!r}: expected a string such as '1m0s'")
    try:
        return _parse(text)
    except _Invalid as err:
        raise ValueError(f"invalid duration {text!r}: {err}") from None


def _parse(orig: str) -> int:
    s = orig
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise _Invalid("no number")

    total = 0
    i = 0
    n = len(s)
    while i < n:
        if not (s[i] == "." or s[i] in _DIGITS):
            raise _Invalid(f"expected a number at {s[i:]!r}")
        start = i
        whole, i = _leading_int(s, i)
        pre = i != start
        frac, scale, post = 0, 1.0, False
        if i < n and s[i] == ".":
            i += 1
            fstart = i
            frac, scale, i = _leading_fraction(s, i)
            post = i != fstart
        if not pre and not post:
            raise _Invalid("a '.' without digits")

        ustart = i
        while i < n and not (s[i] == "." or s[i] in _DIGITS):
            i += 1
        if i == ustart:
            raise _Invalid("missing unit (one of ns, us, µs, ms, s, m, h)")
        unit_text = s[ustart:i]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise _Invalid(f"unknown unit {unit_text!r} (expected one of ns, us, µs, ms, s, m, h)")

        if whole > (1 << 63) // unit:
            raise _Invalid("overflows a 64-bit count of nanoseconds")
        whole *= unit
        if frac > 0:
            # Go computes the fraction in float64 and truncates; do the same for equal results.
            whole += int(float(frac) * (float(unit) / scale))
            if whole > 1 << 63:
                raise _Invalid("overflows a 64-bit count of nanoseconds")
        total += whole
        if total > 1 << 63:
            raise _Invalid("overflows a 64-bit count of nanoseconds")

    if neg:
        return -total
    if total > _MAX_NS:
        raise _Invalid("overflows a 64-bit count of nanoseconds")
    return total


def _fmt_frac(v: int, prec: int) -> tuple[str, int]:
    """Split ``v`` into (".fraction" without trailing zeros, or "", and v // 10**prec)."""
    digits = []
    printed = False
    for _ in range(prec):
        digit = v % 10
        printed = printed or digit != 0
        if printed:
            digits.append(chr(48 + digit))
        v //= 10
    if not printed:
        return "", v
    return "." + "".join(reversed(digits)), v


def format_duration_ns(ns: int) -> str:
    """Format integer nanoseconds exactly as Go's ``time.Duration.String()`` does."""
    if not _MIN_NS <= ns <= _MAX_NS:
        raise ValueError(f"duration of {ns}ns is outside Go's int64 range")
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = -ns if ns < 0 else ns

    if u < SECOND:
        # Below one second Go switches to the largest unit under a second, with a fraction.
        if u < MICROSECOND:
            return f"{sign}{u}ns"
        if u < MILLISECOND:
            frac, whole = _fmt_frac(u, 3)
            return f"{sign}{whole}{frac}\u00b5s"
        frac, whole = _fmt_frac(u, 6)
        return f"{sign}{whole}{frac}ms"

    frac, secs = _fmt_frac(u, 9)
    out = f"{secs % 60}{frac}s"
    minutes = secs // 60
    if minutes > 0:
        out = f"{minutes % 60}m{out}"
        hours = minutes // 60
        if hours > 0:
            out = f"{hours}h{out}"
    return sign + out


def timedelta_to_ns(td: timedelta) -> int:
    """Exact nanoseconds of a timedelta (timedelta is integral in microseconds)."""
    return ((td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds) * MICROSECOND


def timedelta_from_ns(ns: int) -> timedelta:
    """The timedelta of ``ns`` nanoseconds; ``ValueError`` if that would drop nanoseconds."""
    whole_us, rem = divmod(ns, MICROSECOND)
    if rem:
        raise ValueError(
            f"duration of {ns}ns is finer than timedelta's microsecond resolution "
            "(use the *_ns functions for exact nanoseconds)"
        )
    return timedelta(microseconds=whole_us)


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration string into a timedelta (see :func:`parse_duration_ns`)."""
    ns = parse_duration_ns(text)
    try:
        return timedelta_from_ns(ns)
    except ValueError as err:
        raise ValueError(f"invalid duration {text!r}: {err}") from None


def format_duration(td: timedelta) -> str:
    """Format a timedelta exactly as Go's ``time.Duration.String()`` would."""
    return format_duration_ns(timedelta_to_ns(td))


def ns_to_pb(ns: int) -> Duration:
    """A ``google.protobuf.Duration`` holding ``ns`` nanoseconds."""
    out = Duration()
    out.FromNanoseconds(ns)
    return out


def ns_from_pb(d: Duration) -> int:
    """Nanoseconds of a ``google.protobuf.Duration``."""
    return d.seconds * SECOND + d.nanos


def duration_to_pb(td: timedelta) -> Duration:
    """A ``google.protobuf.Duration`` holding the timedelta."""
    return ns_to_pb(timedelta_to_ns(td))


def duration_from_pb(d: Duration) -> timedelta:
    """The timedelta of a ``google.protobuf.Duration``; refuses sub-microsecond remainders."""
    return timedelta_from_ns(ns_from_pb(d))
