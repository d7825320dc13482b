"""JSON lines of record batches (the Kafka sink's values), against Python's own json module.

Every line must be strict JSON (no NaN or Infinity tokens) that ``json.loads`` reads
back as the row's values, with floats staying floats, for adversarial strings
(quotes, backslashes, every control character, non-ASCII), extreme integers and
floats, and nulls everywhere.
"""

from __future__ import annotations

import datetime
import json
import math

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raystream.engine.json_lines import JsonLinesError, json_lines


def strict(line: str) -> dict:
    def refuse(token: str):
        raise AssertionError(f"{token} is not JSON: {line}")

    return json.loads(line, parse_constant=refuse)


def expected(value):
    """What a JSON reader should get back for a Python value of a column."""
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    if isinstance(value, datetime.datetime):
        return int(value.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)
    if isinstance(value, bytes):
        return value.decode()
    return value


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"', "\\", '\\"', "\x00", "\x1f\n\t\r\b\f", "é日本🙂", "\u2028", "null", ""])
rows = st.lists(st.tuples(
    st.none() | texts,
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
        [0.1, 1 / 3, -0.0, 100.0, 1e300, 5e-324, 2.0**53, 1e16]),
    st.none() | st.booleans(),
    st.none() | texts.map(str.encode),
), min_size=1, max_size=30)


@given(rows)
def test_lines_read_back_as_the_rows(data):
    names = ["s", "i", "f", "b", "raw"]
    types = [pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.binary()]
    batch = pa.record_batch([pa.array([r[k] for r in data], t) for k, t in enumerate(types)],
                            names=names)
    lines = json_lines(batch, where="test").to_pylist()
    assert len(lines) == len(data)
    for line, row in zip(lines, data):
        got = strict(line)
        assert list(got) == names
        assert got == {n: expected(v) for n, v in zip(names, row)}
        if got["f"] is not None:
            assert type(got["f"]) is float  # a whole float is not read back as an integer


def test_timestamps_dictionaries_nested_and_odd_names():
    ts = [datetime.datetime(2026, 11, 27, 10, 0, 0, 123000), None]
    batch = pa.record_batch({
        'we"ird\\name': pa.array(["x", "y"]),
        "ts": pa.array(ts, pa.timestamp("us")),
        "tag": pa.array(["a", None]).dictionary_encode(),
        "items": pa.array([[1, 2], None], pa.list_(pa.int64())),
        "f32": pa.array([1.5, float("inf")], pa.float32()),
    })
    got = [strict(line) for line in json_lines(batch, where="test").to_pylist()]
    assert got == [{'we"ird\\name': "x", "ts": expected(ts[0]), "tag": "a", "items": [1, 2],
                    "f32": 1.5},
                   {'we"ird\\name': "y", "ts": None, "tag": None, "items": None, "f32": None}]


def test_bytes_that_are_not_utf8_fail_naming_the_column():
    batch = pa.record_batch({"blob": pa.array([b"ok", b"\xff\xfe"])})
    with pytest.raises(JsonLinesError, match="sink_to_kafka: column 'blob' holds bytes that "
                                             "are not UTF-8"):
        json_lines(batch, where="sink_to_kafka")


def test_empty_batches_and_batches_without_columns():
    empty = pa.record_batch({"x": pa.array([], pa.int64())})
    assert json_lines(empty, where="t").to_pylist() == []
    no_columns = pa.record_batch({"x": [1, 2]}).select([])
    assert json_lines(no_columns, where="t").to_pylist() == ["{}", "{}"]
