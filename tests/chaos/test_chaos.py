"""The exactly-once harness on a fixed set of seeds (``./dev soak`` runs new ones).

Each seed is a job with late data and one to four failures (failpoints, SIGKILLs
of subtask processes after checkpoints, while deploying or while stopping, a stop
with a savepoint restored at another parallelism, a storage outage, a corrupted
newest checkpoint, SIGKILLs of the job master after a checkpoint, while the job
restores or while it stops), checked against a numpy model or the same job run
without failures.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib

import pytest

from tests.chaos.runner import run_scenario
from tests.chaos.scenarios import (DISK_WINDOW_JOBS, PROCESS_WINDOWS_FROM_SEED,
                                   IO_MAPS, IO_MAPS_FROM_SEED, SESSION_JOIN_GAPS_MS,
                                   SESSION_JOINS_FROM_SEED, SQL_FROM_SEED, SQL_JOBS,
                                   TRIGGERS_FROM_SEED, Alignment, Backend, JobKind, Path,
                                   generate)

# Chosen to cover every job kind and window path, aligned, unaligned and timed-out
# alignment, one and two concurrent checkpoints, and every failure kind, in about
# four minutes: 1 sliding/pre-aggregated with a kill during a stop; 3 sliding/dense
# with kills and a corruption; 6 process function, unaligned; 43 tumbling/late
# output with lateness; 64 running sums through an outage and a rescale; 71
# sessions/generic with lateness, an outage and a kill during a stop; 1004 count windows
# through a kill while deploying, a rescale to p=1 and a kill; 1005 a window join chained
# into a window, unaligned, with kills of a source and of the join; 2049 the process
# function on the disk state backend through a kill while deploying, kills and an outage;
# 4002 a job master killed after checkpoints; 5000 the two-input process function; 6055
# the broadcast process function; 7164 incremental checkpoints of the disk backend; 8007
# broadcast on disk, the master killed while the job restores; 8022 co-process on
# incremental disk state, the master killed 86 ms into a stop with a savepoint; 9025
# sliding windows pre-aggregated into panes on incremental disk state, stopped and
# restored at p=3, then a kill; 10001 a window join's rows on disk at p=3 (string keys)
# through a kill while deploying and a failpoint right after the restore; 10008 an
# interval join's rows on disk, its subtask and then the master killed while the job
# restarts; 10228 count windows on disk stopped with a subtask kill 184 ms in, restored
# at p=1, then a failpoint in the asynchronous write; 9161 session windows with a late
# output keeping their open sessions on disk through three kills of their subtasks; 9168
# sliding windows of a user function on disk, stopped with a subtask kill 399 ms in,
# restored at p=3, then a kill of the window; 11380 session windows of a
# ProcessWindowFunction on disk through kills of the window while deploying and after
# checkpoints and a failpoint in its snapshot; 11403 sliding windows of one on incremental
# disk state, stopped with a subtask kill 239 ms in, restored at p=3, then kills; 12158 a
# window join over sessions of up to 861 ms (gap 86 ms) on incremental disk state at p=3,
# the join killed, then failing right after its restore; 12989 one over sessions of a
# row or two a side (gap 10 ms, half of them one-sided) on disk, the join killed while
# deploying, failing in its processing, then killed after checkpoints; 13019 tumbling
# windows of a user function fired by a purging count trigger on incremental disk state,
# unaligned, with lateness, a kill while deploying and the master killed while the job
# restores; 15018 a SQL TUMBLE query through a kill of its window while deploying, a kill
# after checkpoints and the master's; 15885 one stopped at p=2, restored at p=3, its window
# and then the master killed while it restarts; 15168 a SQL HOP query on disk state
# stopped, through an outage and a failpoint in its snapshot; 16002 map_async (ordered)
# through a master kill and kills of the map and the source; 16026 map_async (unordered)
# failing in its snapshot, then killed with the master while the job restarts; 16024 a
# map on an actor pool through an outage, a stop with a kill, a kill with the master's.
CI_SEEDS = [1, 3, 6, 43, 64, 71, 1004, 1005, 2049, 4002, 5000, 6055, 7164, 8007, 8022, 9025,
            9161, 9168, 10001, 10008, 10228, 11380, 11403, 12158, 12989, 13019, 14010, 14050,
            15018, 15885, 15168, 16002, 16026, 16024]
# The default tier's slice (the rest run with ./dev test --all): the failure kinds the
# rest of the default tier does not place, in four jobs — 43 late data with lateness;
# 1004 a kill while deploying, a stop restored at p=1 and a kill; 2049 disk state through
# a kill while deploying, kills and a storage outage; 4002 the job master killed; 14010
# the embarrassingly parallel job at p=3, whose SIGKILL restarts one region; 15018 a SQL
# job through kills of its window and of the master; 16026 unordered async calls in
# flight through a failure in a snapshot and the master's death while the job restarts.
DEFAULT_SEEDS = {43, 1004, 2049, 4002, 14010, 15018, 16026}


@pytest.mark.parametrize("seed", [seed if seed in DEFAULT_SEEDS else
                                  pytest.param(seed, marks=pytest.mark.slow)
                                  for seed in CI_SEEDS])
def test_seed_is_exactly_once(ray_session, tmp_path, seed):
    outcome = run_scenario(generate(seed), str(tmp_path))
    assert outcome.ok, (f"{outcome.scenario.describe()}\nplaced: {outcome.placed}\n"
                        f"reproduce: {outcome.scenario!r}\n" + "\n".join(outcome.differences))


# The scenarios of every seed below PROCESS_WINDOWS_FROM_SEED, as drawn before the process
# window path came: later additions are drawn apart, so these seeds keep their scenario.
OLDER_SEEDS_DIGEST = "98fbbfef60f559850f0ffc245e127f403452c0972319bdfa0930639321a68e59"


def fields_set(value):
    """``value`` with its dataclasses' fields left at their defaults omitted (a field added
    later with a default leaves older scenarios' form alone) and enums as their values."""
    if dataclasses.is_dataclass(value):
        return tuple((f.name, fields_set(getattr(value, f.name)))
                     for f in dataclasses.fields(value)
                     if getattr(value, f.name) != (f.default if f.default_factory is
                                                   dataclasses.MISSING else f.default_factory()))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return tuple(fields_set(v) for v in value)
    return value


def test_older_seeds_keep_their_scenarios():
    forms = "\n".join(repr(fields_set(generate(seed)))
                      for seed in range(PROCESS_WINDOWS_FROM_SEED))
    assert hashlib.sha256(forms.encode()).hexdigest() == OLDER_SEEDS_DIGEST


def test_process_windows_are_drawn_for_time_windows_on_every_backend():
    drawn = {(s.job, s.backend) for s in map(generate, range(PROCESS_WINDOWS_FROM_SEED,
                                                             PROCESS_WINDOWS_FROM_SEED + 1000))
             if s.path is Path.PROCESS_WINDOW}
    assert drawn == {(job, backend) for job in DISK_WINDOW_JOBS for backend in Backend}


def test_session_joins_are_drawn_for_window_joins_on_every_backend():
    drawn = [s for s in map(generate, range(SESSION_JOINS_FROM_SEED, SESSION_JOINS_FROM_SEED + 2000))
             if s.session_gap_ms is not None]
    assert {s.job for s in drawn} == {JobKind.WINDOW_JOIN}
    assert {(s.session_gap_ms, s.backend) for s in drawn} == {
        (gap, backend) for gap in SESSION_JOIN_GAPS_MS for backend in Backend}
    assert all(s.session_gap_ms is None for s in map(generate, range(SESSION_JOINS_FROM_SEED)))


def test_count_triggers_are_drawn_on_every_backend_path_and_purging():
    drawn = [s for s in map(generate, range(TRIGGERS_FROM_SEED, TRIGGERS_FROM_SEED + 2000))
             if s.job is JobKind.TRIGGERED]
    assert {(s.backend, s.path, s.trigger_purges) for s in drawn} == {
        (backend, path, purges) for backend in Backend
        for path in (Path.DENSE, Path.GENERIC, Path.PROCESS_WINDOW) for purges in (False, True)}
    assert {s.lateness_ms for s in drawn} == {0, 2500}
    assert all(s.job is not JobKind.TRIGGERED for s in map(generate, range(TRIGGERS_FROM_SEED)))


def test_sql_jobs_are_drawn_on_every_backend_and_alignment_with_rows_on_time():
    drawn = [s for s in map(generate, range(SQL_FROM_SEED, SQL_FROM_SEED + 2000))
             if s.job in SQL_JOBS]
    assert {(s.job, s.backend, s.alignment) for s in drawn} == {
        (job, backend, alignment) for job in SQL_JOBS for backend in Backend
        for alignment in Alignment}
    assert all(s.lateness_ms == 0 and s.events.late_every > s.events.n for s in drawn)
    assert all(s.job not in SQL_JOBS for s in map(generate, range(SQL_FROM_SEED)))


def test_async_and_pool_maps_are_drawn_at_every_parallelism_and_alignment():
    drawn = [s for s in map(generate, range(IO_MAPS_FROM_SEED, IO_MAPS_FROM_SEED + 2000))
             if s.job in IO_MAPS]
    assert {(s.job, s.unordered, s.parallelism, s.alignment) for s in drawn} == {
        *((JobKind.ASYNC_MAP, unordered, p, a) for unordered in (False, True)
          for p in (1, 2, 3) for a in Alignment),
        *((JobKind.POOL_MAP, False, p, a) for p in (1, 2, 3) for a in Alignment)}
    assert all(s.job not in IO_MAPS for s in map(generate, range(IO_MAPS_FROM_SEED)))
