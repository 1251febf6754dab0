"""The Spark schema of a typed message: ``schema_of(Ride)`` for ``.schema(...)``.

A :class:`~gazette.message.typed.TypedMessage` declares its fields and their types; Spark
reads the same journal with a schema of the same fields, so a job need not infer one from
a sample (which guesses types from whatever the first MiB holds) or restate it by hand.
The schema is a DDL string (no pyspark needed to build it): the meta columns ``_journal``,
``_offset``, ``_uuid``, ``_producer``, ``_publish_time`` (unless ``meta=False``), then each
field by its JSON name, the UUID field left out (it is ``_uuid``).

Types map as Arrow reads JSON into Spark: ``str`` string, ``int`` bigint, ``float`` double,
``bool`` boolean, ``datetime`` timestamp, ``date`` date, ``list``/``set``/``tuple[T, ...]``
array, ``dict[str, T]`` map, a nested Struct, dataclass or TypedDict a struct; ``T | None``
the type of ``T`` (every Spark column is nullable). A type with no Spark counterpart raises
:class:`~gazette.spark.errors.OptionError` naming the field.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec.inspect as mi

from gazette.spark.errors import OptionError

__all__ = ["META_DDL", "schema_of"]

#: The meta columns every decoded row has, as DDL.
META_DDL: Final = ("_journal string, _offset long, _uuid string, _producer string, "
                   "_publish_time timestamp")

_SCALARS: Final[dict[type[mi.Type], str]] = {
    mi.StrType: "string",
    mi.IntType: "bigint",
    mi.FloatType: "double",
    mi.BoolType: "boolean",
    mi.DateTimeType: "timestamp",
    mi.DateType: "date",
    mi.BytesType: "binary",
    mi.ByteArrayType: "binary",
    mi.DecimalType: "decimal(38,18)",
}


def schema_of(message_type: Any, *, meta: bool = True, uuid_field: str = "UUID") -> str:
    """The DDL schema of ``message_type``'s journals (see the module docstring)."""
    info = mi.type_info(message_type)
    if not isinstance(info, mi.StructType | mi.DataclassType | mi.TypedDictType):
        raise OptionError("schema", f"{message_type!r} is not a typed message class")
    fields = ", ".join(f"{_quote(f.encode_name)} {_ddl(f.type, f.encode_name)}"
                       for f in info.fields if f.encode_name != uuid_field)
    if not meta:
        return fields
    return f"{META_DDL}, {fields}" if fields else META_DDL


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl(t: mi.Type, where: str) -> str:
    scalar = _SCALARS.get(type(t))
    if scalar is not None:
        return scalar
    if isinstance(t, mi.Metadata):
        return _ddl(t.type, where)
    if isinstance(t, mi.UnionType):
        others = [u for u in t.types if not isinstance(u, mi.NoneType)]
        if len(others) == 1:
            return _ddl(others[0], where)
    elif isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return f"array<{_ddl(t.item_type, where + '[]')}>"
    elif isinstance(t, mi.DictType):
        return f"map<{_ddl(t.key_type, where + '.key')},{_ddl(t.value_type, where + '.value')}>"
    elif isinstance(t, mi.StructType | mi.DataclassType | mi.TypedDictType):
        inner = ",".join(f"{_quote(f.encode_name)}:{_ddl(f.type, where + '.' + f.encode_name)}"
                         for f in t.fields)
        return f"struct<{inner}>"
    raise OptionError("schema", f"field {where} ({type(t).__name__}) has no Spark type")
