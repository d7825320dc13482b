"""Sources: files (parquet, csv, jsonl, avro), Sequence and Collection, in real Ray jobs
and as split readers.

Oracles: the pyarrow tables written to disk (Avro files written by fastavro itself), and
numpy over the same index.
"""

from __future__ import annotations

import json
import os
import time

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream as rs
from raystream.sources import Collection, Files, Sequence

pytestmark = pytest.mark.timeout(120)

FORMATS = ("parquet", "csv", "jsonl", "avro")
FILE_SIZES = (1, 37, 1000, 250)  # rows per file, in file-name order
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64()),
                    ("flag", pa.bool_())])
AVRO_SCHEMA = {"type": "record", "name": "Row", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "x", "type": "double"}, {"name": "flag", "type": "boolean"}]}
# (no null-like strings such as "" or "null": CSV has no way to tell them from nulls)
NAMES = ["alice", "bob, jr.", 'say "hi"', "é日本", "line\nbreak", "tab\tsep"]


def _table(first_id: int, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    # non-integral, exactly representable, so every format round-trips them as doubles
    x = rng.integers(-100_000, 100_000, n) / 8 + 1 / 16
    names = [NAMES[i] + (f"-{i}" if i % 3 else "") for i in rng.integers(0, len(NAMES), n)]
    flags = rng.integers(0, 2, n).astype(bool)
    return pa.table({"id": ids, "name": names, "x": x, "flag": flags}, schema=SCHEMA)


def _write(table: pa.Table, path: str, fmt: str) -> None:
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=100)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    elif fmt == "avro":  # deflate, in blocks of ~1 KB: a file of many blocks
        with open(path, "wb") as f:
            fastavro.writer(f, AVRO_SCHEMA, table.to_pylist(), codec="deflate",
                            sync_interval=1024)
    else:
        with open(path, "w", encoding="utf-8") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_dataset(root, fmt: str, sizes=FILE_SIZES, seed: int = 0) -> pa.Table:
    """Write one file per size under ``root``; return everything written as one table."""
    root.mkdir(parents=True, exist_ok=True)
    tables, next_id = [], 0
    for i, n in enumerate(sizes):
        t = _table(next_id, n, seed * 100 + i)
        _write(t, str(root / f"part-{i:03d}.{fmt}"), fmt)
        tables.append(t)
        next_id += n
    # files the source must ignore: other extensions and hidden/underscore files
    (root / "README.txt").write_text("not data\n")
    (root / f"_SUCCESS.{fmt}").write_text("")
    (root / f".hidden.{fmt}").write_text("")
    return pa.concat_tables(tables)


def _sorted_rows(table: pa.Table, by: str = "id") -> list[dict]:
    return table.sort_by(by).to_pylist()


# ---------------------------------------------------------------------------
# Files in real jobs
# ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 2])
def test_read_files_returns_every_written_row(ray_session, tmp_path, parallelism):
    env = rs.StreamEnvironment(parallelism=parallelism)
    expected, sinks = {}, {}
    for seed, fmt in enumerate(FORMATS):
        expected[fmt] = _write_dataset(tmp_path / fmt, fmt, seed=seed)
        stream = env.read_files(str(tmp_path / fmt), format=fmt, batch_size=64, name=f"read-{fmt}")
        sinks[fmt] = stream.collect(name=f"collect-{fmt}")
    result = env.execute(f"read-files-p{parallelism}")
    for fmt in FORMATS:
        got = result.table(sinks[fmt])
        assert got.num_rows == sum(FILE_SIZES), fmt
        assert set(got.column_names) == set(SCHEMA.names), fmt
        got = got.select(SCHEMA.names)
        assert got.schema.equals(SCHEMA), (fmt, got.schema)
        assert _sorted_rows(got) == _sorted_rows(expected[fmt]), fmt


def test_read_single_file_path(ray_session, tmp_path):
    table = _table(0, 123, seed=7)
    path = tmp_path / "one.parquet"
    _write(table, str(path), "parquet")
    env = rs.StreamEnvironment(parallelism=2)  # one split: the second subtask reads nothing
    sink = env.read_files(str(path)).collect()
    got = env.execute("read-one-file").table(sink)
    assert _sorted_rows(got.select(SCHEMA.names)) == _sorted_rows(table)


def test_csv_files_are_read_with_one_schema(ray_session, tmp_path):
    """A float column whose values happen to be integral in one file is still a float
    column: all files of one source yield one schema (as spark.read.csv does), so the job
    neither fails on mixed int64/double batches nor returns mixed types."""
    a = pa.table({"id": [0, 1, 2], "x": [1.0, 2.0, 3.0]})  # pyarrow writes these as 1,2,3
    b = pa.table({"id": [3, 4], "x": [0.5, -7.25]})
    pacsv.write_csv(a, str(tmp_path / "a.csv"))
    pacsv.write_csv(b, str(tmp_path / "b.csv"))
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.read_files(str(tmp_path), format="csv").collect()
    got = env.execute("csv-one-schema").table(sink)
    assert pa.types.is_floating(got.schema.field("x").type), got.schema
    assert _sorted_rows(got) == _sorted_rows(pa.concat_tables([a, b]))


def test_missing_path_fails_with_clear_error(ray_session, tmp_path):
    missing = str(tmp_path / "no-such-dir")
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.read_files(missing, format="csv").collect()
    started = time.perf_counter()
    with pytest.raises(rs.JobSetupError) as info:  # on this machine: before the job starts
        env.execute("missing-path").table(sink)
    assert str(info.value) == f"read_files('{missing}'): {missing} does not exist"
    assert time.perf_counter() - started < 60


def test_unknown_format_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="format"):
        Files(str(tmp_path), format="xlsx")


# ---------------------------------------------------------------------------
# Files as split readers (no Ray)
# ---------------------------------------------------------------------------

def test_files_splits_are_the_data_files_in_name_order(tmp_path):
    for fmt in FORMATS:
        _write_dataset(tmp_path / fmt, fmt)
        splits = Files(str(tmp_path / fmt), format=fmt).splits()
        assert [os.path.basename(s) for s in splits] == [
            f"part-{i:03d}.{fmt}" for i in range(len(FILE_SIZES))]


def test_files_accepts_file_uri(tmp_path):
    expected = _write_dataset(tmp_path / "d", "parquet", sizes=(3, 40))
    src = Files(f"file://{tmp_path / 'd'}", format="parquet", batch_size=16)
    rows = []
    for split in src.splits():
        rows += _read_all(src.reader(split)).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == _sorted_rows(expected)


@pytest.fixture(scope="module")
def position_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("positions")
    out = {}
    for fmt in FORMATS:
        table = _table(0, 50, seed=3)
        path = root / f"data.{fmt}"
        _write(table, str(path), fmt)
        out[fmt] = (str(path), table)
    return out


def _read_all(reader) -> pa.Table | None:
    batches = []
    while (batch := reader.next_batch()) is not None:
        batches.append(batch)
    return pa.Table.from_batches(batches) if batches else None


@given(st.sampled_from(FORMATS), st.integers(0, 60), st.sampled_from([1, 7, 50, 64]))
def test_reader_position_skips_rows(position_files, fmt, position, batch_size):
    path, table = position_files[fmt]
    src = Files(path, format=fmt, batch_size=batch_size)
    (split,) = src.splits()
    reader = src.reader(split, position=position)
    got = _read_all(reader)
    expected_rows = table.slice(min(position, table.num_rows)).to_pylist()
    assert (got.select(SCHEMA.names).to_pylist() if got is not None else []) == expected_rows
    # the position counts rows emitted, from where it started
    assert reader.position == position + len(expected_rows)


def test_reader_position_resumes_where_another_stopped(position_files):
    """Read part of a split, then a new reader at the old reader's position reads the rest."""
    path, table = position_files["parquet"]
    src = Files(path, format="parquet", batch_size=7)
    (split,) = src.splits()
    first = src.reader(split)
    head = [first.next_batch() for _ in range(3)]
    resumed = _read_all(src.reader(split, position=first.position))
    rows = pa.Table.from_batches(head).to_pylist() + resumed.to_pylist()
    assert rows == table.to_pylist()


@pytest.mark.parametrize("fmt,zero_bytes", [("parquet", False), ("csv", False), ("csv", True),
                                             ("jsonl", True), ("avro", False), ("avro", True)],
                         ids=["parquet-0-rows", "csv-header-only", "csv-0-bytes", "jsonl-0-bytes",
                              "avro-0-records", "avro-0-bytes"])
def test_empty_file_gives_no_rows(tmp_path, fmt, zero_bytes):
    """A data file without rows is a valid, empty split (an hour without events, a file
    created by ``touch``): it yields no rows and does not fail the read."""
    path = tmp_path / f"empty.{fmt}"
    if zero_bytes:
        path.write_bytes(b"")
    else:
        _write(_table(0, 0, seed=0), str(path), fmt)
    _write(_table(0, 5, seed=1), str(tmp_path / f"full.{fmt}"), fmt)
    src = Files(str(tmp_path), format=fmt)
    rows = []
    for split in src.splits():
        got = _read_all(src.reader(split))
        rows += got.to_pylist() if got is not None else []
    assert sorted(r["id"] for r in rows) == list(range(5))


# ---------------------------------------------------------------------------
# Sequence
# ---------------------------------------------------------------------------

def _seq_columns(index: np.ndarray) -> dict:
    return {"id": index, "sq_mod": (index * index) % 1009, "neg": -index}


@pytest.mark.parametrize("n,num_splits", [(0, 3), (1, 4), (10, 3), (1000, 7), (12345, 5)])
def test_sequence_splits_partition_the_index(n, num_splits):
    src = Sequence(n, columns=_seq_columns, batch_size=100, num_splits=num_splits)
    splits = src.splits()
    assert len(splits) == min(num_splits, n)  # empty ranges are no splits
    assert all(hi > lo for lo, hi in splits)
    covered = [i for lo, hi in splits for i in range(lo, hi)]
    assert covered == list(range(n))
    ids = []
    for split in splits:
        got = _read_all(src.reader(split))
        if got is not None:
            ids += got.column("id").to_pylist()
            np.testing.assert_array_equal(got.column("sq_mod").to_numpy(),
                                          (got.column("id").to_numpy() ** 2) % 1009)
    assert ids == list(range(n))


def test_empty_sequence_job_finishes_with_no_rows(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    sink = env.from_sequence(0).collect()
    assert env.execute("empty-sequence").table(sink).num_rows == 0


def test_sequence_reader_position():
    src = Sequence(100, batch_size=8, num_splits=2)
    split = src.splits()[1]
    reader = src.reader(split, position=13)
    got = _read_all(reader)
    assert got.column("id").to_pylist() == list(range(split[0] + 13, split[1]))
    assert reader.position == split[1] - split[0]


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_sequence_job_matches_numpy(ray_session, parallelism):
    n, num_splits = 20_000, 4
    env = rs.StreamEnvironment(parallelism=parallelism)
    sink = env.from_sequence(n, columns=_seq_columns, batch_size=1000,
                             num_splits=num_splits).collect()
    table = env.execute(f"sequence-p{parallelism}").table(sink)
    # oracle: numpy over the same index
    index = np.arange(n, dtype=np.int64)
    ids = table.column("id").to_numpy()
    order = np.argsort(ids, kind="stable")
    np.testing.assert_array_equal(ids[order], index)
    np.testing.assert_array_equal(table.column("sq_mod").to_numpy()[order], (index * index) % 1009)
    np.testing.assert_array_equal(table.column("neg").to_numpy()[order], -index)
    # the splits are the same at every parallelism (a property of the source, not of the job)
    # and each split is read by one subtask, in order: within every split's index range the
    # ids come out increasing
    bounds = np.linspace(0, n, num_splits + 1).astype(np.int64)
    assert [tuple(s) for s in Sequence(n, num_splits=num_splits).splits()] == [
        (int(bounds[i]), int(bounds[i + 1])) for i in range(num_splits)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        in_split = ids[(ids >= lo) & (ids < hi)]
        assert (np.diff(in_split) > 0).all()


# ---------------------------------------------------------------------------
# Collection
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_from_collection_returns_exactly_the_rows(ray_session):
    rows = [{"k": i, "user": f"u{i % 5}", "amount": (i * 37) % 101, "note": None if i % 4 else "x"}
            for i in range(203)]
    env = rs.StreamEnvironment(parallelism=2)
    sink = env.from_collection(rows, num_splits=3, batch_size=16).collect()
    got = env.execute("collection").table(sink)
    assert got.num_rows == len(rows)
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == rows


def test_collection_splits_and_positions():
    rows = [{"v": i} for i in range(10)]
    src = Collection(rows, num_splits=3, batch_size=2)
    splits = src.splits()
    assert [i for lo, hi in splits for i in range(lo, hi)] == list(range(10))
    lo, hi = splits[2]
    got = _read_all(src.reader(splits[2], position=1))
    assert got.column("v").to_pylist() == list(range(lo + 1, hi))
    # more splits than rows: never an empty split
    assert Collection(rows[:2], num_splits=5).splits() == [(0, 1), (1, 2)]
