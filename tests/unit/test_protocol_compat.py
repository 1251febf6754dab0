"""Wire compatibility with Gazette's protocol (golden data: see tests/golden/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.message import Message

from gazette.protocol import consumer_pb2, generate, protocol_pb2, recoverylog_pb2

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
MODULES = {"protocol": protocol_pb2, "consumer": consumer_pb2, "recoverylog": recoverylog_pb2}


def _our_facts() -> dict[str, dict[str, object]]:
    facts: dict[str, dict[str, object]] = {}

    def walk(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        d: dict[str, object] = {
            "fields": sorted(
                ([f.name, f.number, f.type, f.label, f.type_name.lstrip(".")] for f in m.field),
                key=lambda x: x[1],  # type: ignore[arg-type,return-value]
            )
        }
        if m.reserved_range:
            d["reserved"] = [[r.start, r.end] for r in m.reserved_range]
        facts[prefix + m.name] = d
        for n in m.nested_type:
            walk(prefix + m.name + ".", n)
        for e in m.enum_type:
            facts[prefix + m.name + "." + e.name] = {"enum": {v.name: v.number for v in e.value}}

    for pkg, mod in MODULES.items():
        fd = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fd)
        for m in fd.message_type:
            walk(pkg + ".", m)
        for e in fd.enum_type:
            facts[pkg + "." + e.name] = {"enum": {v.name: v.number for v in e.value}}
        for s in fd.service:
            facts[pkg + "." + s.name] = {
                "service": {
                    mm.name: [mm.input_type.lstrip("."), mm.output_type.lstrip("."), mm.client_streaming, mm.server_streaming]
                    for mm in s.method
                }
            }
    return facts


def test_descriptors_match_gazette() -> None:
    theirs = json.loads((GOLDEN / "gazette_descriptors.json").read_text())
    ours = json.loads(json.dumps(_our_facts()))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name] == theirs[name], name


def _message_class(full_name: str) -> type[Message]:
    pkg, _, rest = full_name.partition(".")
    obj: object = MODULES[pkg]
    for part in rest.split("."):
        obj = getattr(obj, part)
    assert isinstance(obj, type) and issubclass(obj, Message)
    return obj


GOLDEN_ENCODINGS = json.loads((GOLDEN / "gazette_encodings.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN_ENCODINGS))
def test_golden_encodings_round_trip(name: str) -> None:
    g = GOLDEN_ENCODINGS[name]
    cls = _message_class(name)
    decoded = cls.FromString(bytes.fromhex(g["hex"]))
    # Field for field: the text form of our decoding equals Gazette's.
    assert text_format.MessageToString(decoded, as_one_line=True) == g["text"]
    # And back: our encoding of Gazette's text is byte-identical.
    built = text_format.Parse(g["text"], cls())
    assert built.SerializeToString(deterministic=True).hex() == g["hex"]


def test_generated_modules_are_fresh() -> None:
    assert generate.main(["--check"]) == 0
