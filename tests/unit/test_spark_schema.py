"""schema_of: a typed message's fields as Spark DDL, the UUID left to the meta columns."""

from __future__ import annotations

import dataclasses
import datetime

import msgspec
import pytest

from gazette.message import TypedMessage
from gazette.spark import OptionError, schema_of
from gazette.spark.schema import META_DDL


class Point(msgspec.Struct):
    x: float
    y: float


@dataclasses.dataclass
class Tag:
    name: str


class Trip(TypedMessage):
    rider: str
    legs: int
    at: datetime.datetime
    start: Point
    tags: list[Tag] = []
    by_day: dict[str, int] = {}
    note: str | None = None
    odd_name: bool = msgspec.field(default=False, name="odd`name")


def test_every_field_maps_and_the_uuid_is_left_to_the_meta_columns() -> None:
    assert schema_of(Trip, meta=False) == (
        "`rider` string, `legs` bigint, `at` timestamp, `start` struct<`x`:double,`y`:double>, "
        "`tags` array<struct<`name`:string>>, `by_day` map<string,bigint>, `note` string, "
        "`odd``name` boolean")
    assert schema_of(Trip).startswith(META_DDL + ", `rider` string")


def test_a_field_without_a_spark_type_is_named() -> None:
    class Odd(TypedMessage):
        either: int | str

    with pytest.raises(OptionError, match="either"):
        schema_of(Odd)
    with pytest.raises(OptionError, match="not a typed message"):
        schema_of(int)
