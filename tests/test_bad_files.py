"""Bad input files name themselves: every read error of ``read_files`` says which file
(and row group, CSV row or JSON line where that is known) and why, and a job that asks
for ``errors="dead_letter"`` gets unreadable files (or row groups) on a side output
instead of failing, all-or-nothing per split.

Every case is a real file on disk read by a real job. Oracles: pandas over the good
files; the row and line numbers are where the test wrote the bad row.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import fastavro
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import raystream as rs
from raystream.engine.errors import FilePosition
from raystream.sources import Files
from raystream.spark.commit_log import read_committed
from tests.support.jobs import cancel_after_a_checkpoint, committed_rows

pytestmark = pytest.mark.timeout(120)

ROWS = 3000  # per file: a CSV file of this size spans several read blocks


def good_table(first_id: int, n: int = ROWS) -> pa.Table:
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return pa.table({"id": ids, "amount": ids * 3 % 1000})


def write_parquet(path: Path, table: pa.Table, row_group_size: int | None = None) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def job_failure(env: rs.StreamEnvironment, stream: rs.DataStream) -> str:
    """The first line of the error of a job that must fail (what the CLI and logs show):
    a file it cannot read fails it with an error both ``except rs.FileReadError`` and
    ``except rs.JobFailedError`` catch."""
    stream.collect()
    with pytest.raises(rs.FileReadError) as info:
        env.execute("bad-files")
    assert isinstance(info.value, rs.JobFailedError)
    return str(info.value).splitlines()[0]


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite the data pages of one row group with garbage (the footer stays intact)."""
    column = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------
# errors="fail" (the default): the job fails, naming the file
# ---------------------------------------------------------------------------

def test_a_truncated_parquet_file_names_itself(ray_session, tmp_path):
    write_parquet(tmp_path / "a.parquet", good_table(0))
    bad = write_parquet(tmp_path / "b.parquet", good_table(ROWS))
    bad.write_bytes(bad.read_bytes()[:200])  # footer gone
    env = rs.StreamEnvironment(parallelism=2)
    message = job_failure(env, env.read_files(str(tmp_path), name="orders-in"))
    assert "'orders-in'" in message
    assert str(bad) in message
    assert "Parquet magic bytes not found" in message


def test_a_garbage_parquet_file_names_itself(ray_session, tmp_path):
    write_parquet(tmp_path / "a.parquet", good_table(0))
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"this is not parquet at all\n" * 40)
    env = rs.StreamEnvironment(parallelism=1)
    message = job_failure(env, env.read_files(str(tmp_path)))
    assert str(bad) in message
    assert "Parquet magic bytes not found" in message


def test_a_corrupt_row_group_names_the_file_and_the_row_group(ray_session, tmp_path):
    bad = write_parquet(tmp_path / "a.parquet", good_table(0), row_group_size=ROWS // 4)
    corrupt_row_group(bad, 2)
    env = rs.StreamEnvironment(parallelism=2)
    message = job_failure(env, env.read_files(str(tmp_path)))
    assert str(bad) in message
    assert "row group 2" in message


def test_a_csv_row_with_extra_fields_names_the_file_and_the_row(ray_session, tmp_path):
    pacsv.write_csv(good_table(0), tmp_path / "a.csv")
    lines = ["id,amount"] + [f"{i},{i % 7}" for i in range(ROWS)]
    lines[2500] = "2499,1,surprise"  # the header is row 1
    bad = write_lines(tmp_path / "b.csv", lines)
    env = rs.StreamEnvironment(parallelism=2)
    message = job_failure(env, env.read_files(str(tmp_path), format="csv", batch_size=100))
    assert str(bad) in message
    assert "Expected 2 columns, got 3" in message
    assert "row 2501" in message


def test_a_non_json_line_names_the_file_the_line_and_its_offset(ray_session, tmp_path):
    lines = [json.dumps({"id": i, "amount": i % 7}) for i in range(ROWS)]
    lines[10:10] = ["", "   "]  # blank lines count as lines (not as records)
    lines[2000] = "this is not json"
    bad = write_lines(tmp_path / "b.jsonl", lines)
    env = rs.StreamEnvironment(parallelism=1)
    message = job_failure(env, env.read_files(str(tmp_path), format="jsonl", batch_size=100))
    offset = sum(len(line) + 1 for line in lines[:2000])
    assert str(bad) in message
    assert "JSON parse error" in message
    assert f"(line 2001, byte offset {offset})" in message
    assert " in row " not in message  # pyarrow's record count within a read block


def test_a_parquet_column_whose_type_changed_names_the_file(ray_session, tmp_path):
    write_parquet(tmp_path / "a.parquet", pa.table({"id": [1, 2], "amount": [3, 4]}))
    bad = write_parquet(tmp_path / "b.parquet", pa.table({"id": [5, 6], "amount": ["x", "y"]}))
    env = rs.StreamEnvironment(parallelism=2)
    message = job_failure(env, env.read_files(str(tmp_path)))
    assert str(bad) in message
    assert "amount" in message and "int64" in message and "string" in message


def test_a_parquet_column_that_does_not_fit_the_schema_names_the_file_and_column(
        ray_session, tmp_path):
    write_parquet(tmp_path / "a.parquet", pa.table({"id": [1, 2], "amount": [3, 4]}))
    bad = write_parquet(tmp_path / "b.parquet", pa.table({"id": [5, 6], "amount": ["7", "x"]}))
    schema = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
    env = rs.StreamEnvironment(parallelism=1)
    message = job_failure(env, env.read_files(str(tmp_path), schema=schema))
    assert str(bad) in message
    assert "column 'amount'" in message
    assert "Failed to parse string: 'x'" in message


def test_a_csv_column_whose_type_changed_names_the_file(ray_session, tmp_path):
    pacsv.write_csv(good_table(0), tmp_path / "a.csv")
    bad = write_lines(tmp_path / "b.csv", ["id,amount", "1,x", "2,y"])
    env = rs.StreamEnvironment(parallelism=1)
    message = job_failure(env, env.read_files(str(tmp_path), format="csv"))
    assert str(bad) in message
    assert "int64 vs string" in message


@pytest.mark.parametrize("fmt, header, bad_row, where, cause", [
    ("csv", ["id,amount"], "1700,seven", "(row 1701)", "invalid value 'seven'"),  # header: row 1
    ("jsonl", [], json.dumps({"id": 1700, "amount": "seven"}), "(line 1701, byte offset",
     "Column(/amount) changed from number to string"),
])
def test_a_value_that_does_not_fit_the_schema_names_the_file_and_where(
        ray_session, tmp_path, fmt, header, bad_row, where, cause):
    rows = [f"{i},{i % 7}" if fmt == "csv" else json.dumps({"id": i, "amount": i % 7})
            for i in range(ROWS)]
    rows[1700 - len(header)] = bad_row
    bad = write_lines(tmp_path / f"b.{fmt}", header + rows)
    schema = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
    env = rs.StreamEnvironment(parallelism=1)
    message = job_failure(env, env.read_files(str(tmp_path), format=fmt, schema=schema))
    assert str(bad) in message
    assert cause in message
    assert where in message


def test_a_reader_raises_a_file_read_error_with_the_parse_error_as_its_cause(tmp_path):
    bad = write_lines(tmp_path / "b.csv", ["id,amount", "1,2", "3,4,5"])
    source = Files(str(bad), format="csv")
    with pytest.raises(rs.FileReadError) as info:
        source.reader(source.splits()[0]).next_batch()
    assert info.value.path == str(bad)
    assert info.value.position == FilePosition(row=3)
    assert isinstance(info.value.__cause__, pa.ArrowInvalid)


def test_a_bad_avro_file_names_itself_and_the_record_or_is_a_dead_letter(tmp_path):
    """Avro container files by hand (no Ray): a file that is not Avro, and one cut short
    in a later block, fail naming the file (and the record where reading stopped); under
    errors="dead_letter" each is one dead letter and no row."""
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": "long"}]}
    with open(tmp_path / "a.avro", "wb") as f:  # fastavro's own file, blocks of ~1 KB
        fastavro.writer(f, schema, good_table(0).to_pylist(), sync_interval=1024)
    whole = (tmp_path / "a.avro").read_bytes()
    (tmp_path / "b.avro").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "c.avro").write_bytes(b"id,amount\n1,2\n")

    def read(path: Path, errors: str = "fail") -> tuple[pa.Table | None, object]:
        source = Files(str(path), format="avro", errors=errors, batch_size=500)
        reader = source.reader(source.splits()[0])
        batches = []
        while (batch := reader.next_batch()) is not None:
            batches.append(batch)
        return (pa.Table.from_batches(batches) if batches else None,
                getattr(reader, "dead_letter", None))

    table, _ = read(tmp_path / "a.avro")
    assert table is not None and table.to_pylist() == good_table(0).to_pylist()
    with pytest.raises(rs.FileReadError) as info:
        read(tmp_path / "b.avro")
    assert str(info.value).startswith(f"cannot read {tmp_path / 'b.avro'} (row ")
    row = info.value.position.row
    assert row is not None and 1 < row <= ROWS  # a later block: the records before it were read
    with pytest.raises(rs.FileReadError, match="not an Avro container file") as info:
        read(tmp_path / "c.avro")
    assert info.value.path == str(tmp_path / "c.avro")
    for name in ("b.avro", "c.avro"):
        table, letter = read(tmp_path / name, errors="dead_letter")
        assert table is None and letter is not None
        assert letter.to_pylist()[0]["path"] == str(tmp_path / name)


def test_errors_must_be_fail_or_dead_letter(tmp_path):
    env = rs.StreamEnvironment()
    with pytest.raises(ValueError, match="errors must be one of .*'dead_letter'.*'fail'.*'skip'"):
        env.read_files(str(tmp_path), errors="skip")


# ---------------------------------------------------------------------------
# errors="dead_letter": unreadable splits go to the side output, whole
# ---------------------------------------------------------------------------

def dead_letter_job(path: Path, parallelism: int = 2, **options) -> tuple[pa.Table, pa.Table]:
    env = rs.StreamEnvironment(parallelism=parallelism)
    rows = env.read_files(str(path), errors="dead_letter", batch_size=100, **options)
    main, dead = rows.collect(), rows.side_output(rs.sources.DEAD_LETTERS).collect(name="dead")
    result = env.execute("dead-letters")
    return result.table(main), result.table(dead)


def as_sorted_frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas().sort_values("id").reset_index(drop=True)


@pytest.mark.slow
def test_bad_files_go_to_the_dead_letter_output_and_good_files_are_read_whole(
        ray_session, tmp_path):
    good = [write_parquet(tmp_path / "a.parquet", good_table(0)),
            write_parquet(tmp_path / "c.parquet", good_table(2 * ROWS), row_group_size=700)]
    truncated = write_parquet(tmp_path / "b.parquet", good_table(ROWS))
    truncated.write_bytes(truncated.read_bytes()[:100])
    split = write_parquet(tmp_path / "d.parquet", good_table(3 * ROWS), row_group_size=1000)
    corrupt_row_group(split, 1)

    main, dead = dead_letter_job(tmp_path)

    readable = pq.ParquetFile(split)
    expected = pd.concat([pd.read_parquet(p) for p in good]
                         + [readable.read_row_group(k).to_pandas() for k in (0, 2)])
    pd.testing.assert_frame_equal(as_sorted_frame(main),
                                  expected.sort_values("id").reset_index(drop=True))
    letters = dead.sort_by("path").to_pylist()
    assert [(d["path"], d["row_group"]) for d in letters] == [(str(truncated), None),
                                                             (str(split), 1)]
    assert "Parquet magic bytes not found" in letters[0]["error"]
    assert str(split) in letters[1]["error"] and "row group 1" in letters[1]["error"]


@pytest.mark.slow
def test_a_bad_csv_file_is_not_read_at_all_under_dead_letter(ray_session, tmp_path):
    good = [tmp_path / "a.csv", tmp_path / "c.csv"]
    pacsv.write_csv(good_table(0), good[0])
    pacsv.write_csv(good_table(2 * ROWS), good[1])
    lines = ["id,amount"] + [f"{ROWS + i},{i % 7}" for i in range(ROWS)]
    lines[-1] += ",extra"  # the last row: every row before it parses
    bad = write_lines(tmp_path / "b.csv", lines)

    main, dead = dead_letter_job(tmp_path, format="csv")

    expected = pd.concat([pd.read_csv(p) for p in good]).sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(as_sorted_frame(main), expected)
    assert dead.column("path").to_pylist() == [str(bad)]
    assert f"row {ROWS + 1}" in dead.column("error")[0].as_py()


def test_a_file_whose_column_type_changed_is_a_dead_letter(ray_session, tmp_path):
    lines = [json.dumps({"id": i, "amount": i % 7}) for i in range(ROWS)]
    good = write_lines(tmp_path / "a.jsonl", lines)
    bad = write_lines(tmp_path / "b.jsonl", [json.dumps({"id": -1, "amount": "seven"})])

    main, dead = dead_letter_job(tmp_path, format="jsonl", parallelism=1)

    expected = pd.read_json(good, lines=True)
    pd.testing.assert_frame_equal(as_sorted_frame(main), expected)
    assert dead.column("path").to_pylist() == [str(bad)]
    assert "int64 vs string" in dead.column("error")[0].as_py()


@pytest.mark.slow
def test_a_bad_file_that_appears_while_the_job_runs_is_a_dead_letter_exactly_once(
        ray_session, tmp_path):
    source_dir, out, dead_out = tmp_path / "in", tmp_path / "out", tmp_path / "dead"
    source_dir.mkdir()
    schema = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
    files, bad_index = 8, 5
    env = rs.StreamEnvironment(
        parallelism=2,
        # the dead letter fails its first attempt on its way to the sink: the restored
        # job must read the bad file again and describe it once
        failpoints=[rs.Failpoint("in_processing", operator="dead-tag", hit=1, action="raise")],
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "checkpoints")),
        restart=rs.RestartStrategy.fixed_delay(attempts=3, delay_s=0.0))
    rows = env.read_files(str(source_dir), schema=schema, batch_size=100,
                          monitor_interval_s=0.1, errors="dead_letter")
    rows.rebalance().map_batches(lambda b: b, name="tag").sink_to_parquet(str(out))
    (rows.side_output(rs.sources.DEAD_LETTERS).rebalance()
        .map_batches(lambda b: b, name="dead-tag").sink_to_parquet(str(dead_out), name="dead"))
    client = env.execute_async("watch-bad-files")

    def produce() -> None:
        for index in range(files):
            final = source_dir / f"part-{index:03d}.parquet"
            staging = tmp_path / final.name  # written elsewhere, renamed in whole
            write_parquet(staging, good_table(index * ROWS), row_group_size=1000)
            if index == bad_index:
                staging.write_bytes(b"PAR1 half a file")
            staging.rename(final)
            time.sleep(0.25)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    good_rows = (files - 1) * ROWS

    deadline = time.monotonic() + 90
    while (committed_rows(out) < good_rows or committed_rows(dead_out) < 1
           or client.progress()["attempt"] < 1):
        assert time.monotonic() < deadline, (committed_rows(out), committed_rows(dead_out),
                                             client.progress()["failures"])
        time.sleep(0.2)
    progress = cancel_after_a_checkpoint(client)

    ids = np.sort(read_committed(str(out))["id"].to_numpy())
    expected = np.concatenate([np.arange(i * ROWS, (i + 1) * ROWS)
                               for i in range(files) if i != bad_index])
    np.testing.assert_array_equal(ids, expected)  # every good row once, none of the bad file
    letters = read_committed(str(dead_out)).to_pylist()
    assert [d["path"] for d in letters] == [str(source_dir / f"part-{bad_index:03d}.parquet")]
    assert progress["attempt"] == 1, progress["failures"]
    assert "failpoint in_processing" in progress["failures"][0]
    assert "dead-tag" in progress["failures"][0]  # it failed on the dead letter


def test_the_guide_dead_letter_example_runs(ray_session):
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    section = readme[readme.index("## Bad input files"):]
    start = section.index("```python\n") + len("```python\n")
    namespace: dict = {}
    exec(compile(section[start:section.index("```", start)], "docs/guide.md", "exec"), namespace)
    result, inbox = namespace["result"], namespace["inbox"]
    assert result.table(namespace["good"]).sort_by("order").to_pydict() == {
        "order": [1, 2], "amount": [10, 20]}
    assert result.table(namespace["bad"]).column("path").to_pylist() == [f"{inbox}/b.parquet"]
