"""Split-based sources (FLIP-27): enumerators hand splits to readers through operator
events; the continuous file source picks up files while the job runs, exactly once."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

import raystream as rs
from raystream.engine.sources.files import Files, FileSplitEnumerator
from raystream.engine.sources.kafka import KafkaSourceConfig, KafkaSplitEnumerator
from raystream.engine.sources.split_enumerator import StaticSplitEnumerator
from raystream.spark.commit_log import read_committed
from tests.support.jobs import cancel_after_a_checkpoint, committed_rows, wait_for_checkpoint

SCHEMA = pa.schema([("id", pa.int64()), ("file", pa.int64())])


class Assignments:
    """An enumerator context that records what it was told (the enumerator units)."""

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.assigned: dict[int, list] = {}
        self.ended: list[int] = []
        self.later: list = []
        self.async_calls: list = []

    def registered_readers(self):
        return set(range(self.parallelism))

    def assign_split(self, split, subtask):
        self.assign_splits([split], subtask)

    def assign_splits(self, splits, subtask):
        self.assigned.setdefault(subtask, []).extend(splits)

    def signal_no_more_splits(self, subtask):
        self.ended.append(subtask)

    def call_later(self, delay_s, callback):
        self.later.append(callback)

    def call_async(self, work, handler):
        self.async_calls.append((work, handler))

    def finish_async(self) -> None:
        """Run the pending call_async work and handlers, as the master's threads would."""
        while self.async_calls:
            work, handler = self.async_calls.pop(0)
            handler(work(), None)


def test_the_static_enumerator_deals_splits_round_robin_and_restores_what_it_kept():
    context = Assignments(parallelism=2)
    enumerator = StaticSplitEnumerator(context, ["a", "b", "c", "d", "e"])
    enumerator.add_reader(1)
    state = enumerator.snapshot_state(1)
    assert context.assigned == {1: ["b", "d"]} and context.ended == [1]
    restored = StaticSplitEnumerator(Assignments(parallelism=3), [], state)
    restored.add_reader(0)  # at parallelism 3, [k, split] pairs keep their k
    assert restored.context.assigned == {0: ["a"]}
    assert restored.snapshot_state(2) == [[2, "c"], [4, "e"]]


def test_a_bounded_kafka_read_restored_from_before_its_first_listing_lists_before_it_ends():
    """A checkpoint taken while the first listing of partitions was still running holds
    none: restored, the read must list them, not tell its readers that no split will
    come (which ended the job FINISHED with nothing read)."""
    config = KafkaSourceConfig("127.0.0.1:9", topics=("t",), bounded_until="latest")
    context = Assignments(parallelism=2)
    first = KafkaSplitEnumerator(context, config, None)
    first.start()  # the listing is on a worker thread, not done yet
    state = first.snapshot_state(1)
    assert state["seen"] == [] and state["listed"] is False

    restored_context = Assignments(parallelism=2)
    restored = KafkaSplitEnumerator(restored_context, config, state)
    restored.start()
    restored.add_reader(0)
    assert restored_context.ended == [] and len(restored_context.async_calls) == 1
    # the listing's answer: then each reader gets its partition, and the end
    _, on_listed = restored_context.async_calls.pop()
    on_listed([{"topic": "t", "partition": p, "start": 0, "stop": 5} for p in (0, 1)], None)
    assert sorted(restored_context.ended) == [0, 1]
    assert sum(len(s) for s in restored_context.assigned.values()) == 2
    # the same from a checkpoint of before "listed" was kept (an empty "seen": not listed)
    older_context = Assignments(parallelism=2)
    older = KafkaSplitEnumerator(older_context, config, {"seen": [], "pending": []})
    older.start()
    older.add_reader(1)
    assert older_context.ended == [] and len(older_context.async_calls) == 1
    # a checkpoint of the listed read restores as listed: no second listing
    again_context = Assignments(parallelism=2)
    KafkaSplitEnumerator(again_context, config, restored.snapshot_state(2)).start()
    assert again_context.async_calls == [] and sorted(again_context.ended) == [0, 1]


def write_file(directory, index: int, rows: int, row_group_size: int | None = None) -> None:
    """File ``index`` holds ids ``index * rows ... + rows - 1``; it appears whole (rename)."""
    table = pa.table({"id": np.arange(index * rows, (index + 1) * rows, dtype=np.int64),
                      "file": np.full(rows, index, dtype=np.int64)}, schema=SCHEMA)
    hidden = os.path.join(directory, f".part-{index:03d}.parquet")
    pq.write_table(table, hidden, row_group_size=row_group_size)
    os.rename(hidden, os.path.join(directory, f"part-{index:03d}.parquet"))


def test_the_file_enumerator_splits_parquet_by_row_group_and_waits_for_new_files(tmp_path):
    write_file(tmp_path, 0, rows=30, row_group_size=10)
    context = Assignments(parallelism=2)
    enumerator = FileSplitEnumerator(context, Files(str(tmp_path), monitor_interval_s=1.0))
    enumerator.start()
    enumerator.handle_split_request(0)  # the listing is still running: the reader waits
    assert context.assigned == {} and context.ended == []
    context.finish_async()
    for reader in (1, 0, 1):
        enumerator.handle_split_request(reader)
    assert [s["row_group"] for s in context.assigned[0] + context.assigned[1]] == [0, 2, 1]
    write_file(tmp_path, 1, rows=5)
    context.later.pop()()  # the next listing: the waiting reader gets the new file
    context.finish_async()
    assert context.assigned[1][-1].endswith("part-001.parquet") and context.ended == []
    state = enumerator.snapshot_state(7)
    assert len(state["seen"]) == 2 and state["pending"] == []


def test_a_bounded_file_enumerator_ends_readers_only_after_its_listing(tmp_path):
    write_file(tmp_path, 0, rows=10)
    context = Assignments(parallelism=2)
    enumerator = FileSplitEnumerator(context, Files(str(tmp_path)))
    enumerator.start()
    enumerator.handle_split_request(1)
    assert context.ended == []  # not "no more splits" before the files are listed
    context.finish_async()
    assert context.assigned[1][0].endswith("part-000.parquet")
    enumerator.handle_split_request(0)
    assert context.ended == [0]
    restored = FileSplitEnumerator(Assignments(parallelism=2), Files(str(tmp_path)),
                                   enumerator.snapshot_state(3))
    restored.start()  # a restored bounded read does not list again
    restored.handle_split_request(0)
    assert restored.context.async_calls == [] and restored.context.ended == [0]


def test_a_bounded_file_read_ends_when_the_files_are_read(ray_session, tmp_path):
    for index in range(5):
        write_file(tmp_path, index, rows=200, row_group_size=64 if index % 2 else None)
    env = rs.StreamEnvironment(parallelism=3)
    sink = env.read_files(str(tmp_path), batch_size=50).collect()
    ids = np.sort(env.execute("bounded-files").table(sink)["id"].to_numpy())
    np.testing.assert_array_equal(ids, np.arange(1000))


def test_files_that_appear_while_the_job_runs_are_read_exactly_once_across_failures(
        ray_session, tmp_path):
    source_dir, out = tmp_path / "in", tmp_path / "out"
    source_dir.mkdir()
    files, rows = 16, 300
    failpoints = [rs.Failpoint("in_processing", operator="tag", subtask=1, hit=4, attempt=1,
                               action="raise"),
                  rs.Failpoint("in_snapshot", operator="files", subtask=0, hit=2, attempt=2)]
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "checkpoints")),
        restart=rs.RestartStrategy.fixed_delay(attempts=5, delay_s=0.0))
    (env.read_files(str(source_dir), schema=SCHEMA, batch_size=64, monitor_interval_s=0.1)
        .rebalance().map_batches(lambda b: b, name="tag").sink_to_parquet(str(out)))
    client = env.execute_async("watch-files")

    def produce():
        for index in range(files):
            write_file(source_dir, index, rows, row_group_size=100 if index % 3 == 0 else None)
            time.sleep(0.25)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for_checkpoint(client, timeout_s=60)
        ray.kill(client.subtask_actor("files", 1))  # after a completed checkpoint
    finally:
        producer.join()
    deadline = time.monotonic() + 120  # every row committed, every placed failure happened
    while committed_rows(out) < files * rows or client.progress()["attempt"] < 3:
        assert time.monotonic() < deadline, (committed_rows(out), client.progress()["failures"])
        time.sleep(0.2)
    progress = cancel_after_a_checkpoint(client)  # the last attempt commits nothing new
    ids = np.sort(read_committed(str(out))["id"].to_numpy())
    np.testing.assert_array_equal(ids, np.arange(files * rows))  # every row, once
    assert progress["attempt"] == 3, progress["failures"]
    assert "died" in progress["failures"][0]
    assert "failpoint in_processing" in progress["failures"][1]
    assert "died" in progress["failures"][2]
