"""Checkpoint lifecycle of the CheckpointCoordinator (no Ray needed).

The coordinator is a plain class driven by the job master's event thread, so
it is built directly here: a real ``CheckpointConfig`` and real checkpoint
files under ``tmp_path``, and plain callables standing in for the Ray calls
to the subtasks (they record what they receive; tests/support/coordinator.py).

Time: ``trigger()`` and completion read ``time.monotonic()`` themselves, and
``tick(now)`` compares ``now`` with those readings. ``tick_in(c, dt)`` passes
``time.monotonic() + dt``, which is at least ``dt`` after every earlier
reading, and at most ``dt`` plus the test's elapsed time (milliseconds) after
it. So with thresholds far apart (e.g. 50 s vs. 100 s) each assertion is
deterministic, and no test sleeps.

Every expectation comes from the configuration or from what the test itself
wrote (handles from ``write_state``, file listings with ``os.listdir``,
metadata read through a separate ``CheckpointStorage``), never from output
copied back.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import numpy as np
import pytest

from raystream.checkpoint.barrier import SnapshotKind
from raystream.checkpoint.restore import OperatorRestore, RestoreSpec
from raystream.checkpoint.coordinator import CheckpointCoordinator
from raystream.checkpoint.pending_checkpoint import AcknowledgeResult
from raystream.checkpoint.snapshot_stats import PHASES, SnapshotStats
from raystream.checkpoint.storage import CheckpointStorage, CorruptCheckpointError, StateHandle
from raystream.core.failpoints import Failpoint, InjectedFailure
from tests.support.coordinator import JOB, SUBTASKS, ack_all, make, subtask_state

# -- helpers ---------------------------------------------------------------------------------


def tick_in(coord: CheckpointCoordinator, dt: float) -> None:
    """Tick as if ``dt`` seconds had passed since now."""
    coord.tick(time.monotonic() + dt)


def state(coord: CheckpointCoordinator, n: int, name: str, data: bytes) -> dict:
    """Really write a state file of checkpoint ``n``; its handle as JSON."""
    return coord.storage.write_state(JOB, n, name, data).to_json()


def complete(coord: CheckpointCoordinator, written: dict | None = None) -> int:
    """Trigger a checkpoint and acknowledge it from every subtask."""
    n = coord.trigger()
    ack_all(coord, n, written)
    return n


def chk_dirs(tmp_path) -> list[int]:
    """Ids of the chk-<id> directories on disk (plain os.listdir)."""
    job_dir = tmp_path / JOB
    if not job_dir.is_dir():
        return []
    return sorted(int(name[4:]) for name in os.listdir(job_dir)
                  if name.startswith("chk-") and (job_dir / name).is_dir())


def completed_ids(coord: CheckpointCoordinator) -> list[int]:
    return [c.checkpoint_id for c in coord.completed]


# -- triggering --------------------------------------------------------------------------------


def test_periodic_trigger_waits_for_interval(tmp_path):
    coord, rec = make(tmp_path, interval_s=100.0)
    tick_in(coord, 50.0)  # the coordinator counts the interval from its creation
    assert rec.triggered == []

    tick_in(coord, 100.0)
    assert rec.triggered == [1]
    assert rec.barriers[0].attempt == 0
    assert list(coord.pending) == [1] and coord.history[1].status == "PENDING"

    ack_all(coord, 1)
    assert rec.completed == [1]
    tick_in(coord, 50.0)  # half an interval after the last trigger
    assert rec.triggered == [1]
    tick_in(coord, 100.0)
    assert rec.triggered == [1, 2]


def test_min_pause_counts_from_the_last_completion(tmp_path):
    coord, rec = make(tmp_path, interval_s=1.0, min_pause_s=100.0)
    n = coord.trigger()
    ack_all(coord, n)
    assert rec.completed == [n]

    tick_in(coord, 50.0)  # interval long passed, pause not yet
    assert rec.triggered == [n]
    tick_in(coord, 100.0)
    assert rec.triggered == [n, n + 1]


def test_min_pause_does_not_delay_the_first_checkpoint(tmp_path):
    # min_pause_s is "time between the end of one checkpoint and the start of the
    # next": before any checkpoint completed, only interval_s applies. A pause longer
    # than the host's uptime (time.monotonic()) shows whether "no completion yet"
    # is modelled as a completion at monotonic time 0.
    coord, rec = make(tmp_path, interval_s=1.0, min_pause_s=time.monotonic() + 1e6)
    tick_in(coord, 2.0)
    assert rec.triggered == [1]


def test_max_concurrent_one_blocks_the_next_trigger(tmp_path):
    coord, rec = make(tmp_path, interval_s=1.0, max_concurrent=1)
    tick_in(coord, 1.0)
    assert rec.triggered == [1]
    for dt in (1.0, 10.0, 1000.0):
        tick_in(coord, dt)
    assert rec.triggered == [1] and list(coord.pending) == [1]

    ack_all(coord, 1)
    tick_in(coord, 1.0)
    assert rec.triggered == [1, 2]


def test_max_concurrent_two_allows_two_pending(tmp_path):
    coord, rec = make(tmp_path, interval_s=1.0, max_concurrent=2)
    tick_in(coord, 1.0)
    tick_in(coord, 1.0)
    assert rec.triggered == [1, 2]
    tick_in(coord, 1.0)
    tick_in(coord, 1000.0)
    assert rec.triggered == [1, 2] and sorted(coord.pending) == [1, 2]

    ack_all(coord, 2)  # completes 2 and subsumes 1: none pending
    tick_in(coord, 1.0)
    tick_in(coord, 1.0)
    assert rec.triggered == [1, 2, 3, 4]
    tick_in(coord, 1.0)
    assert rec.triggered == [1, 2, 3, 4]


# -- completion --------------------------------------------------------------------------------


def test_completes_only_when_every_subtask_acknowledged(tmp_path):
    coord, rec = make(tmp_path)
    n = coord.trigger()
    handles = {s: state(coord, n, f"op-{s[0]}-{s[1]}.op", f"state of {s}".encode()) for s in SUBTASKS}
    written = {s: {"op": subtask_state(operator_state=handles[s])} for s in SUBTASKS}
    sizes = {s: 10 * (i + 1) for i, s in enumerate(SUBTASKS)}

    for s in SUBTASKS[:-1]:
        coord.acknowledge(0, n, s, written[s], SnapshotStats(size=sizes[s]))
        assert rec.completed == [] and n in coord.pending
        assert not (tmp_path / JOB / f"chk-{n}" / "_metadata").exists()
    last = SUBTASKS[-1]
    coord.acknowledge(0, n, last, written[last], SnapshotStats(size=sizes[last]))

    assert rec.completed == [n]  # exactly once
    assert rec.aborted == []
    # notify_complete ran only once the metadata was readable and verified
    at_notify = rec.metadata_at_notify[n]
    assert isinstance(at_notify, dict), at_notify
    metadata = CheckpointStorage(str(tmp_path)).read_metadata(JOB, n)
    assert at_notify == metadata
    by_path = lambda hs: sorted(hs, key=lambda h: h["path"])  # noqa: E731
    assert by_path(metadata["operators"]["op"]["operator_state"]) == by_path(handles.values())
    assert metadata["operators"]["op"]["keyed_state"] == []
    assert by_path(metadata["handles"]) == by_path(handles.values())
    assert metadata["checkpoint_id"] == n and metadata["max_parallelism"] == 128
    # the handles verify against the bytes written
    for s, h in handles.items():
        assert coord.storage.read_state(StateHandle.from_json(h)) == f"state of {s}".encode()

    assert coord.pending == {}
    assert completed_ids(coord) == [n]
    assert coord.history[n].status == "COMPLETED"
    assert coord.history[n].size == sum(sizes.values())
    assert coord.failures_in_a_row == 0


def test_a_checkpoints_phases_are_the_longest_of_any_subtask(tmp_path):
    """Start delay, alignment, synchronous and asynchronous part: each the slowest
    subtask's (Flink's checkpoint details), so the history says where the time went."""
    coord, _ = make(tmp_path)
    n = coord.trigger()
    rng = np.random.default_rng(3)
    figures = {s: dict(zip(PHASES, rng.uniform(0, 1, len(PHASES)))) for s in SUBTASKS}
    for s in SUBTASKS:
        coord.acknowledge(0, n, s, {}, SnapshotStats(**figures[s]))
    for phase in PHASES:
        assert getattr(coord.history[n], phase) == max(f[phase] for f in figures.values())


def test_late_acknowledgement_after_completion_does_not_notify_again(tmp_path):
    coord, rec = make(tmp_path)
    n = complete(coord)
    coord.acknowledge(0, n, SUBTASKS[0], {}, SnapshotStats())
    assert rec.completed == [n]


def test_acknowledgements_of_an_older_attempt_are_ignored(tmp_path):
    coord, rec = make(tmp_path)
    coord.start_attempt(1, coord.failpoints)  # as the job master does on failover
    n = coord.trigger()
    assert rec.barriers[-1].attempt == 1
    ack_all(coord, n, attempt=0)
    assert rec.completed == [] and coord.pending[n].waiting == set(SUBTASKS)
    ack_all(coord, n, attempt=1)
    assert rec.completed == [n]


def test_acknowledgement_for_an_unknown_checkpoint_is_ignored(tmp_path):
    coord, rec = make(tmp_path)
    n = coord.trigger()
    for s in SUBTASKS:
        coord.acknowledge(0, n + 7, s, {}, SnapshotStats())
    assert coord.pending[n].waiting == set(SUBTASKS)
    assert n + 7 not in coord.pending and n + 7 not in coord.history
    assert rec.completed == [] and chk_dirs(tmp_path) == []


def test_duplicate_acknowledgement_from_one_subtask_is_ignored(tmp_path):
    coord, rec = make(tmp_path)
    n = coord.trigger()
    first = state(coord, n, "op-0.op", b"first")
    second = state(coord, n, "op-0.retry.op", b"second")
    a, b, c = SUBTASKS
    coord.acknowledge(0, n, a, {"op": subtask_state(operator_state=first)}, SnapshotStats(size=5))
    coord.acknowledge(0, n, a, {"op": subtask_state(operator_state=second)}, SnapshotStats(size=6))
    coord.acknowledge(0, n, (9, 9), {}, SnapshotStats(size=1))  # not a subtask of this job
    coord.acknowledge(0, n, b, {}, SnapshotStats(size=0))
    assert rec.completed == [] and coord.pending[n].waiting == {c}

    coord.acknowledge(0, n, c, {}, SnapshotStats(size=0))
    assert rec.completed == [n]
    metadata = coord.storage.read_metadata(JOB, n)
    assert metadata["operators"]["op"]["operator_state"] == [first]
    assert metadata["handles"] == [first]
    assert coord.history[n].size == 5


def test_every_acknowledgement_says_what_it_did_and_is_counted(tmp_path):
    """Flink's TaskAcknowledgeResult: a first acknowledgement succeeds, a second one of the
    same subtask is a duplicate, one of a subtask or checkpoint the coordinator does not
    know is unknown, one of an aborted checkpoint or an older attempt is discarded."""
    coord, _ = make(tmp_path)
    n = coord.trigger()
    a, b, _c = SUBTASKS
    results = [coord.acknowledge(0, n, a, {}, SnapshotStats()),
               coord.acknowledge(0, n, a, {}, SnapshotStats()),
               coord.acknowledge(0, n, (9, 9), {}, SnapshotStats()),
               coord.acknowledge(0, n + 7, a, {}, SnapshotStats()),
               coord.acknowledge(1, n, b, {}, SnapshotStats())]
    coord.decline(0, n, b, "disk full")
    results.append(coord.acknowledge(0, n, b, {}, SnapshotStats()))
    R = AcknowledgeResult
    assert results == [R.SUCCESS, R.DUPLICATE, R.UNKNOWN, R.UNKNOWN, R.DISCARDED, R.DISCARDED]
    assert coord.acknowledgements == {R.SUCCESS: 1, R.DUPLICATE: 1, R.UNKNOWN: 2,
                                      R.DISCARDED: 2}


# -- aborts --------------------------------------------------------------------------------------


def test_decline_aborts_and_counts_failures_in_a_row(tmp_path):
    coord, rec = make(tmp_path)
    n1 = coord.trigger()
    coord.acknowledge(0, n1, SUBTASKS[0], {}, SnapshotStats())
    coord.decline(0, n1, SUBTASKS[1], "disk full")
    assert rec.aborted == [n1]
    assert coord.history[n1].status == "ABORTED"
    assert "disk full" in coord.history[n1].reason
    assert n1 not in coord.pending
    assert coord.failures_in_a_row == 1
    coord.acknowledge(0, n1, SUBTASKS[1], {}, SnapshotStats())  # late: ignored
    coord.acknowledge(0, n1, SUBTASKS[2], {}, SnapshotStats())
    assert rec.completed == [] and completed_ids(coord) == []
    assert not (tmp_path / JOB / f"chk-{n1}" / "_metadata").exists()

    n2 = coord.trigger()
    coord.decline(1, n2, SUBTASKS[0], "from another attempt")  # ignored
    assert n2 in coord.pending and coord.failures_in_a_row == 1
    coord.decline(0, n2, SUBTASKS[2], "serializer error")
    assert rec.aborted == [n1, n2] and coord.failures_in_a_row == 2

    n3 = complete(coord)
    assert rec.completed == [n3]
    assert coord.failures_in_a_row == 0
    assert n1 < n2 < n3


def test_timeout_aborts_a_pending_checkpoint_on_tick(tmp_path):
    coord, rec = make(tmp_path, interval_s=1000.0, timeout_s=5.0)
    n = coord.trigger()
    tick_in(coord, 2.0)
    assert n in coord.pending and rec.aborted == []

    tick_in(coord, 5.5)
    assert rec.aborted == [n]
    assert coord.history[n].status == "ABORTED"
    assert "timed out" in coord.history[n].reason
    assert coord.failures_in_a_row == 1
    assert rec.triggered == [n]  # interval not reached: nothing new
    ack_all(coord, n)  # too late
    assert rec.completed == []


def test_completing_a_newer_checkpoint_subsumes_pending_older_ones(tmp_path):
    coord, rec = make(tmp_path, max_concurrent=2)
    n1, n2 = coord.trigger(), coord.trigger()
    coord.acknowledge(0, n1, SUBTASKS[0], {}, SnapshotStats())
    ack_all(coord, n2)

    assert rec.completed == [n2]
    assert rec.aborted == [n1]
    assert coord.history[n1].status == "ABORTED"
    assert "subsumed" in coord.history[n1].reason
    assert coord.pending == {} and completed_ids(coord) == [n2]
    ack_all(coord, n1)  # the rest of n1 arrives late
    assert rec.completed == [n2]
    assert not (tmp_path / JOB / f"chk-{n1}" / "_metadata").exists()


def test_subsumption_is_not_a_failure(tmp_path):
    # failures_in_a_row counts checkpoints that failed (declines, timeouts) and
    # resets on completion; a checkpoint subsumed by a newer *completed* one did
    # not fail (Flink's CheckpointFailureManager ignores CHECKPOINT_SUBSUMED).
    coord, rec = make(tmp_path, max_concurrent=2)
    n1, n2 = coord.trigger(), coord.trigger()
    ack_all(coord, n2)
    assert rec.aborted == [n1] and rec.completed == [n2]
    assert coord.failures_in_a_row == 0


def test_abort_all_aborts_every_pending_checkpoint(tmp_path):
    coord, rec = make(tmp_path, max_concurrent=3)
    ns = [coord.trigger() for _ in range(3)]
    coord.abort_all("failover after: boom")
    assert rec.aborted == ns and coord.pending == {}
    assert all("boom" in coord.history[n].reason for n in ns)


def test_failed_metadata_write_aborts_the_checkpoint(tmp_path):
    coord, rec = make(tmp_path)
    n = coord.trigger()
    job_dir = tmp_path / JOB
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.write_bytes(b"not a directory")  # runs as root: chmod would not stop writes

    ack_all(coord, n)
    assert rec.completed == []
    assert rec.aborted == [n]
    assert coord.history[n].status == "ABORTED"
    assert "metadata" in coord.history[n].reason
    assert coord.pending == {} and completed_ids(coord) == []
    assert coord.failures_in_a_row == 1

    job_dir.unlink()  # storage usable again: the next checkpoint completes
    n2 = complete(coord)
    assert n2 > n and rec.completed == [n2]
    assert coord.failures_in_a_row == 0


def test_failpoint_after_metadata_fails_before_notifying(tmp_path):
    fp = Failpoint("after_metadata_before_notify", action="raise")
    coord, rec = make(tmp_path, failpoints=[fp])
    n = coord.trigger()
    with pytest.raises(InjectedFailure):
        ack_all(coord, n)
    assert rec.completed == []  # nobody was told ...
    assert coord.storage.read_metadata(JOB, n)["checkpoint_id"] == n  # ... but it is durable
    assert completed_ids(coord) == [n]


# -- retention and ids ---------------------------------------------------------------------------


def test_retention_keeps_only_the_newest_checkpoints(tmp_path):
    coord, rec = make(tmp_path, retained=2)
    ids = []
    for i in range(4):
        n = coord.trigger()
        h = state(coord, n, "op-0.op", f"state {i}".encode())
        ack_all(coord, n, {SUBTASKS[0]: {"op": subtask_state(operator_state=h)}})
        ids.append(n)
    assert rec.completed == ids
    assert chk_dirs(tmp_path) == ids[-2:]
    assert completed_ids(coord) == ids[-2:]
    for n in ids[-2:]:
        assert coord.storage.read_metadata(JOB, n)["checkpoint_id"] == n


def test_ids_keep_increasing_across_a_coordinator_restart(tmp_path):
    coord, rec = make(tmp_path)
    complete(coord)
    complete(coord)
    aborted = coord.trigger()
    state(coord, aborted, "op-0.op", b"written before the decline")
    coord.decline(0, aborted, SUBTASKS[1], "gone")
    assert aborted not in chk_dirs(tmp_path)  # an aborted checkpoint's files are discarded
    state(coord, aborted, "op-1.op", b"a slow subtask writes after the abort")
    on_disk = chk_dirs(tmp_path)
    assert aborted in on_disk  # ... so its directory can reappear

    restarted, rec2 = make(tmp_path)
    n = restarted.trigger()
    assert n > max(on_disk)
    assert rec2.triggered == [n]
    ack_all(restarted, n)
    assert rec2.completed == [n]


# -- final checkpoint ----------------------------------------------------------------------------


def test_final_checkpoint_stops_periodic_triggers_until_aborted(tmp_path):
    coord, rec = make(tmp_path, interval_s=1.0, max_concurrent=3)
    final = coord.trigger(SnapshotKind.FINAL_CHECKPOINT)
    assert coord.final_checkpoint == final
    tick_in(coord, 10.0)
    tick_in(coord, 1000.0)
    assert rec.triggered == [final]  # room for 2 more, but none periodic while final is set

    coord.decline(0, final, SUBTASKS[0], "not yet")
    assert coord.final_checkpoint is None
    assert rec.aborted == [final]
    tick_in(coord, 1.0)
    assert rec.triggered == [final, final + 1]


def test_no_periodic_trigger_after_the_final_checkpoint_completed(tmp_path):
    coord, rec = make(tmp_path, interval_s=1.0)
    final = coord.trigger(SnapshotKind.FINAL_CHECKPOINT)
    ack_all(coord, final)
    assert rec.completed == [final] and coord.final_checkpoint == final
    tick_in(coord, 10.0)
    assert rec.triggered == [final]


def test_a_failed_final_checkpoint_is_triggered_again_at_the_interval_only(tmp_path):
    coord, _ = make(tmp_path, interval_s=1000.0)
    assert coord.final_due(time.monotonic())  # the first one at once
    final = coord.trigger(SnapshotKind.FINAL_CHECKPOINT)
    coord.decline(0, final, SUBTASKS[0], "storage is not writable")
    assert coord.final_checkpoint is None
    assert not coord.final_due(time.monotonic())  # never a busy loop of final checkpoints
    assert coord.final_due(time.monotonic() + 1000.0)


def test_final_checkpoint_timing_out_resets_it(tmp_path):
    coord, rec = make(tmp_path, interval_s=1000.0, timeout_s=5.0)
    final = coord.trigger(SnapshotKind.FINAL_CHECKPOINT)
    tick_in(coord, 6.0)
    assert rec.aborted == [final] and coord.final_checkpoint is None


# -- restore -------------------------------------------------------------------------------------


def two_checkpoints(coord: CheckpointCoordinator) -> dict[int, tuple[dict, dict]]:
    """Checkpoints 1 and 2 with operator and keyed state; their handles."""
    a, b, _ = SUBTASKS
    handles = {}
    for n_expected in (1, 2):
        n = coord.trigger()
        assert n == n_expected
        op = state(coord, n, "op-0.op", f"operator state {n}".encode())
        keyed = state(coord, n, "op-1.keyed", f"keyed state {n}".encode())
        handles[n] = (op, keyed)
        try:
            ack_all(coord, n, {a: {"op": subtask_state(operator_state=op)},
                               b: {"op": subtask_state(keyed_state=keyed)}})
        except InjectedFailure:
            pass
    return handles


def flip_first_byte(path: str) -> None:
    with open(path, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_verified_restore_spec_skips_a_corrupt_newest_checkpoint_that_committed_nothing(tmp_path):
    # checkpoint 2 is durable, but the failure comes before anyone is told: nothing committed
    coord, rec = make(tmp_path, failpoints=[
        Failpoint("after_metadata_before_notify", hit=2, action="raise")])
    handles = two_checkpoints(coord)
    assert rec.completed == [1] and completed_ids(coord) == [1, 2]

    spec = coord.verified_restore_spec()  # nothing corrupt: the newest
    storage = coord.config.storage  # restored files are read from the job's checkpoint storage
    assert spec == RestoreSpec(2, storage,
                               {"op": OperatorRestore([StateHandle.from_json(handles[2][0])],
                                                     [StateHandle.from_json(handles[2][1])])})

    flip_first_byte(handles[2][1]["path"])
    spec = coord.verified_restore_spec()
    assert spec == RestoreSpec(1, storage,
                               {"op": OperatorRestore([StateHandle.from_json(handles[1][0])],
                                                     [StateHandle.from_json(handles[1][1])])})
    assert completed_ids(coord) == [1]
    assert coord.history[2].status == "CORRUPT"
    assert coord.history[1].status == "COMPLETED"
    assert coord.latest().checkpoint_id == 1
    # ids stay monotonic: the corrupt id is not reused
    assert coord.trigger() == 3


def test_a_corrupt_checkpoint_that_committed_output_is_never_skipped(tmp_path):
    coord, rec = make(tmp_path)
    handles = two_checkpoints(coord)
    assert rec.completed == [1, 2]  # both notified: committers may have committed them
    flip_first_byte(handles[2][1]["path"])
    with pytest.raises(CorruptCheckpointError,
                       match=f"{re.escape(handles[2][1]['path'])}.*checksum mismatch.*committed "
                             f"up to checkpoint 2"):
        coord.verified_restore_spec()
    assert completed_ids(coord) == [1, 2]  # nothing forgotten


def test_restore_spec_without_completed_checkpoints_is_none(tmp_path):
    coord, _ = make(tmp_path)
    assert coord.verified_restore_spec() is None
    assert coord.restore_spec() is None


def test_a_long_jobs_checkpoint_history_stays_bounded(monkeypatch, tmp_path):
    """Thousands of checkpoints keep the newest HISTORY_RETAINED rows, oldest first, and
    never forget one still pending."""
    import raystream.checkpoint.coordinator as coordinator_module
    monkeypatch.setattr(coordinator_module, "HISTORY_RETAINED", 5)
    coord, _ = make(tmp_path, max_concurrent=100, tolerable_failures=100)
    pending = coord.trigger()
    for _ in range(12):
        coord.abort(coord.trigger(), "test", failed=False)
    ids = [s.checkpoint_id for s in coord.stats()]
    assert ids == [pending, *range(pending + 9, pending + 13)]


def test_a_late_writer_recreating_an_aborted_checkpoint_leaves_no_directory(tmp_path):
    """A subtask still writing into checkpoint n after n was aborted and deleted creates
    chk-n again; the next completed checkpoint's clean-up removes it."""
    coord, _ = make(tmp_path, retained=2, tolerable_failures=10)
    first = complete(coord)
    aborted = coord.trigger()
    coord.decline(coord.attempt, aborted, SUBTASKS[0], "disk full")
    assert aborted not in chk_dirs(tmp_path)
    state(coord, aborted, "late.op", b"written after the abort")  # the late writer
    assert aborted in chk_dirs(tmp_path)
    latest = complete(coord)
    assert chk_dirs(tmp_path) == [first, latest]
