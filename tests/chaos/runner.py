"""Runs a :class:`~tests.chaos.scenarios.Scenario` with its failures and compares its
committed output with the oracles.

Oracles: for windows over tumbling, sliding and session assigners, for running
sums and for window joins (over 1 s windows or sessions), the numpy, pandas and
plain-Python models of :mod:`tests.chaos.model`; for the process function, the
same job run once without failures (its own output is checked against invariants
of the model: every input row counted once). After each SIGKILL of a subtask
after checkpoints, local recovery is checked too: the killed subtask's replacement
restored from storage, and on the heap backend some survivor from its process's
copy. Every difference is returned as a line of text; none means the run was
exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path as FsPath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import raystream as rs
from raystream.engine.recovery import RecoveryStage
from raystream.spark.commit_log import read_committed
from tests.chaos.model import (CountAndSum, Emissions, count_trigger_emissions,
                               emission_differences, emissions_of, session_run,
                               window_emissions, window_join_emissions)
from tests.support.jobs import progress, subtask_pid, wait_for_checkpoints, wait_until
from tests.support.pacing import Brake, Throttle
from tests.chaos.scenarios import (TRIGGER_COUNT, Alignment, Backend, Failure, FailureKind,
                                   JobKind, Path, Scenario, Sink)

ASSIGNERS = {JobKind.TUMBLING: rs.TumblingEventTimeWindows(size_ms=1000),
             JobKind.TRIGGERED: rs.TumblingEventTimeWindows(size_ms=1000),
             JobKind.SLIDING: rs.SlidingEventTimeWindows(size_ms=1000, slide_ms=500),
             JobKind.SESSION: rs.EventTimeSessionWindows(gap_ms=300),
             JobKind.SQL_TUMBLE: rs.TumblingEventTimeWindows(size_ms=1000),
             JobKind.SQL_HOP: rs.SlidingEventTimeWindows(size_ms=1000, slide_ms=500)}
KEYED = {JobKind.TUMBLING: "window", JobKind.SLIDING: "window", JobKind.SESSION: "window",
         JobKind.REDUCE: "sum", JobKind.PROCESS: "process", JobKind.WINDOW_JOIN: "join",
         JobKind.COUNT_WINDOW: "count-window", JobKind.INTERVAL_JOIN: "join",
         JobKind.CO_PROCESS: "co-process", JobKind.BROADCAST: "weigh",
         JobKind.TRIGGERED: "window", JobKind.REGIONS: "map",
         # the window operator the planner makes of the environment's first query
         JobKind.SQL_TUMBLE: "query-1.window", JobKind.SQL_HOP: "query-1.window",
         JobKind.ASYNC_MAP: "map", JobKind.POOL_MAP: "map"}
# the jobs of one row-wise map from a source at the job's parallelism into the sink
ROW_MAPS = (JobKind.REGIONS, JobKind.ASYNC_MAP, JobKind.POOL_MAP)
# the SQL jobs' windows, as the window table functions of the same windows as ASSIGNERS'
SQL_WINDOWS = {JobKind.SQL_TUMBLE: "TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND)",
               JobKind.SQL_HOP: "HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '0.5' SECOND, "
                                "INTERVAL '1' SECOND)"}
CO_PROCESS_DELAY_MS = 500  # SideCounts' and Weigh's timer after a row's time
RULES = rs.MapStateDescriptor("rules")  # Weigh's broadcast state: rule time -> weight
RULE_EVERY = 50  # the broadcast rules: every 50th row's time (2 ms apart: one per 100 ms)
SESSION_RIGHT_SHIFT_MS = 13  # a session join's right rows after their left twins
TIMEOUT_S = 240
INTERVAL_S = 0.15  # the jobs' checkpoint interval
# Liveness: once every source has read its input and a checkpoint has completed since,
# the job ends within three intervals and a restart (with room for a slow 2-core day)
RESTART_S = 10.0
LIVENESS_S = 3 * INTERVAL_S + RESTART_S
DIAGNOSE_EVERY_S = 0.5
REGION_SPLITS = 4  # the regions job's source splits (its readers get 2 or 1 each)
DIED = re.compile(r"subtask (\d+)/\d+ of '([^']+)' died")  # a subtask's failure, as reported


class NotLive(AssertionError):
    """A job read all its input, completed a checkpoint since, and did not end."""


@dataclass
class Outcome:
    """What a run did: its failures as placed (or why not), and the differences found."""

    scenario: Scenario
    placed: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.differences


class Activity(rs.KeyedProcessFunction):
    """Per key: a count in state, an event-time timer 500 ms after each row (reported
    with the count then), rows late by the operator's watermark reported as such, and
    a processing-time timer whose firing only marks state (its time is not replayable)."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.ticks = ctx.value_state("ticks", default=0)

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        if row["ts"] <= ctx.current_watermark:
            yield {"user": ctx.current_key, "kind": "late", "at": row["ts"], "count": -1}
        ctx.register_event_time_timer(row["ts"] + 500)
        ctx.register_processing_time_timer(ctx.current_processing_time() + 50)

    def on_timer(self, timestamp, ctx):
        if ctx.time_domain == "event_time":
            yield {"user": ctx.current_key, "kind": "timer", "at": timestamp,
                   "count": self.count.value()}
        else:
            self.ticks.update(self.ticks.value() + 1)


class SideCounts(rs.KeyedCoProcessFunction):
    """Per key, the rows of each input in map state (time -> rows), and an event-time
    timer ``CO_PROCESS_DELAY_MS`` after each row's time that reports how many rows of
    each input had a time at or before it. Replayable: no row is beyond the watermark
    bound, so when a timer fires every row of either input up to its time has arrived."""

    def open(self, ctx):
        self.times = (ctx.map_state("first"), ctx.map_state("second"))

    def _add(self, side: int, row: dict, ctx) -> None:
        times = self.times[side]
        times.put(row["ts"], times.get(row["ts"], 0) + 1)
        ctx.register_event_time_timer(row["ts"] + CO_PROCESS_DELAY_MS)

    def process_element1(self, row, ctx):
        self._add(0, row, ctx)

    def process_element2(self, row, ctx):
        self._add(1, row, ctx)

    def on_timer(self, timestamp, ctx):
        first, second = (sum(n for t, n in times.items() if t <= timestamp)
                         for times in self.times)
        yield {"user": ctx.current_key, "at": timestamp, "first": first, "second": second}


class Weigh(rs.KeyedBroadcastProcessFunction):
    """Keyed rows kept by time in map state; an event-time timer ``CO_PROCESS_DELAY_MS``
    after each reports how many rows of the key had a time at or before it and the sum
    of the weights of the broadcast rules up to that time. Replayable for the reason
    SideCounts is: the rules carry event time too, and the timer counts only those up to
    its own."""

    def open(self, ctx):
        self.times = ctx.map_state("times")

    def process_broadcast_element(self, rule, ctx):
        ctx.get_broadcast_state(RULES).put(rule["ts"], rule["x"])

    def process_element(self, row, ctx):
        self.times.put(row["ts"], self.times.get(row["ts"], 0) + 1)
        ctx.register_event_time_timer(row["ts"] + CO_PROCESS_DELAY_MS)

    def on_timer(self, timestamp, ctx):
        rules = ctx.get_broadcast_state(RULES)
        yield {"user": ctx.current_key, "at": timestamp,
               "rows": sum(n for t, n in self.times.items() if t <= timestamp),
               "weight": sum(w for t, w in rules.items() if t <= timestamp)}


class CountAndSumRows(rs.ProcessWindowFunction):
    """What ``agg(n=("count", None), total=("sum", "x"))`` computes, from all of a
    window's rows at once (the process window path)."""

    def process(self, key, window, rows):
        yield {"user": key, "window_start": window.start, "window_end": window.end,
               "n": rows.num_rows, "total": float(np.sum(rows["x"].to_numpy()))}


def count_and_sum_function(kind: str):
    """``n`` and ``total`` of a window's rows along each window path: ``columnar`` (built-in
    aggregates), ``aggregate`` (:class:`CountAndSum`), ``process`` (:class:`CountAndSumRows`)."""
    from raystream.engine.windows.aggregates import AggregateSpec
    from raystream.engine.windows.functions import (BuiltinAggregates, ProcessWindow,
                                                    UserAggregate)
    if kind == "columnar":
        return BuiltinAggregates(AggregateSpec.of({"n": ("count", None), "total": ("sum", "x")}))
    if kind == "aggregate":
        return UserAggregate(CountAndSum(), "result")  # pyright: ignore[reportArgumentType]
    return ProcessWindow(CountAndSumRows())


def window_schema(events) -> pa.Schema:
    """The columns ``agg`` gives the window (a ProcessWindowFunction's would be inferred
    per batch)."""
    return pa.schema([("user", pa.string() if events.string_keys else pa.int64()),
                      ("window_start", pa.int64()), ("window_end", pa.int64()),
                      ("n", pa.int64()), ("total", pa.float64())])


def rule_columns(events, i: np.ndarray) -> dict:
    columns = events.columns(i * RULE_EVERY)
    return {"ts": columns["ts"], "x": columns["x"]}


def reduce_columns(events, i: np.ndarray) -> dict:
    return {**events.columns(i), "i": i, "n": np.ones(len(i), np.int64)}


def join_right_columns(events, i: np.ndarray, shift_ms: int = 0) -> dict:
    columns = events.columns(i)
    return {"user": columns["user"], "ts": columns["ts"] + shift_ms,
            "y": (i % 7).astype(np.float64)}


def right_shift_ms(scenario: Scenario) -> int:
    """How long after its left twin a window join's right row comes: at once in 1 s
    windows, ``SESSION_RIGHT_SHIFT_MS`` in sessions (so that some have one side only)."""
    return 0 if scenario.session_gap_ms is None else SESSION_RIGHT_SHIFT_MS


def join_windows(scenario: Scenario
                 ) -> rs.TumblingEventTimeWindows | rs.EventTimeSessionWindows:
    if scenario.session_gap_ms is None:
        return rs.TumblingEventTimeWindows(size_ms=1000)
    return rs.EventTimeSessionWindows(gap_ms=scenario.session_gap_ms)


def trigger_of(scenario: Scenario) -> rs.Trigger | None:
    """The count trigger of a TRIGGERED job (None: the window's default)."""
    if scenario.job is not JobKind.TRIGGERED:
        return None
    count = rs.CountTrigger(count=TRIGGER_COUNT)
    return rs.PurgingTrigger(count) if scenario.trigger_purges else count


def with_double_x(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The regions job's map: ``y = 2 x`` beside the input's columns."""
    return batch.append_column("y", pc.multiply(batch.column("x"), 2.0))


async def double_x(row: dict) -> dict:
    """The async job's call: ``y = 2 x`` after a delay of up to 4 ms, drawn from the row."""
    await asyncio.sleep(random.Random(f"{row['user']}/{row['ts']}").uniform(0, 4) / 1000)
    return {**row, "y": row["x"] * 2.0}


class DoubleX:
    """The pool job's model: ``y = 2 x`` of an Arrow batch."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return with_double_x(batch)


def row_map(scenario: Scenario, rows: rs.DataStream) -> rs.DataStream:
    """``y = 2 x`` per row, as the scenario's job computes it."""
    if scenario.job is JobKind.ASYNC_MAP:
        return rows.map_async(double_x, capacity=32, ordered=not scenario.unordered, name="map")
    if scenario.job is JobKind.POOL_MAP:
        return rows.map_batches(DoubleX, concurrency=(1, 2), num_cpus=0.1, batch_size=100,
                                name="map")
    return rows.map_batches(with_double_x, name="map")


def sql_windows(scenario: Scenario, env: rs.StreamEnvironment, rows: rs.DataStream
                ) -> rs.DataStream:
    """Count and sum per (key, window) of ``rows`` as a SQL query over a view of them (their
    ``ts`` as the rowtime), with ``window_start`` in milliseconds as the other jobs emit it."""
    events = scenario.events
    schema = pa.schema([("user", pa.string() if events.string_keys else pa.int64()),
                        ("ts", pa.timestamp("ms")), ("x", pa.float64())])
    env.create_temporary_view("events", rows, schema=schema, rowtime="ts")
    query = env.sql_query(f"SELECT user, window_start, COUNT(*) AS n, SUM(x) AS total "
                          f"FROM TABLE({SQL_WINDOWS[scenario.job]}) "
                          f"GROUP BY user, window_start, window_end")
    return query.to_stream().map_batches(window_start_in_ms, name="in-ms")


def timestamped_columns(events, i: np.ndarray) -> dict:
    """The events with ``ts`` as a timestamp (a SQL rowtime is one)."""
    columns = events.columns(i)
    return {**columns, "ts": pa.array(columns["ts"], pa.timestamp("ms"))}


def window_start_in_ms(batch: pa.RecordBatch) -> pa.RecordBatch:
    index = batch.schema.get_field_index("window_start")
    return batch.set_column(index, "window_start",
                            batch.column(index).cast(pa.int64()))


def add(acc: dict, row: dict) -> dict:
    return {**row, "x": acc["x"] + row["x"], "n": acc["n"] + row["n"]}


THROTTLE_S = 0.05  # a batch's pause until the failures are placed


def build(scenario: Scenario, env: rs.StreamEnvironment, out: str, pace: Throttle | None):
    """The scenario's job on ``env``, its sources slowed by ``pace`` (None: at full
    speed); returns (main output, late output or None)."""
    events = scenario.events
    watermarks = rs.BoundedOutOfOrderness("ts", bound_ms=events.bound_ms)

    def source(name: str, columns, n: int = events.n):
        stream = env.from_sequence(n, columns, batch_size=events.batch, num_splits=1,
                                   parallelism=1, name=name, watermarks=watermarks)
        # the same operator names paced or not: failures are placed by name
        return stream.map_batches(pace or (lambda batch: batch), name=f"{name}-throttle",
                                  parallelism=1)

    late = None
    if scenario.job in ROW_MAPS:
        # at the job's parallelism all the way: one region per subtask, and the committer
        rows = env.from_sequence(events.n, events.columns, batch_size=events.batch,
                                 num_splits=REGION_SPLITS, name="source", watermarks=watermarks)
        result = row_map(scenario, rows.map_batches(pace or (lambda batch: batch),
                                                    name="source-throttle"))
    elif scenario.job is JobKind.REDUCE:
        # two readers of one half of the rows each: their union feeds the running sums
        half = events.n // 2
        first = source("source", lambda i: reduce_columns(events, i), half)
        second = source("source-2", lambda i: reduce_columns(events, i + half), half)
        result = first.union(second).key_by("user").reduce(add, name="sum")
    elif scenario.job is JobKind.PROCESS:
        result = source("source", events.columns).key_by("user").process(Activity(),
                                                                         name="process")
    elif scenario.job is JobKind.WINDOW_JOIN:
        # the same keys and times on both sides (the right ones maybe shifted), other
        # values: many pairs per key and window
        half, shift = events.n // 2, right_shift_ms(scenario)
        clicks = source("source", events.columns, half)
        views = source("source-2", lambda i: join_right_columns(events, i, shift), half)
        pairs = (clicks.join(views).where("user").equal_to("user")
                 .window(join_windows(scenario), timestamp="ts").join(name="join"))
        # chained on the join's results by their event time (window_end - 1)
        result = pairs.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=1000)).agg(
            n=("count", None), total=("sum", "y"), first=("min", "window_start"),
            last=("max", "window_end"), name="pairs")
    elif scenario.job is JobKind.INTERVAL_JOIN:
        half = events.n // 2
        clicks = source("source", events.columns, half).key_by("user")
        views = source("source-2", lambda i: join_right_columns(events, i), half).key_by("user")
        result = clicks.interval_join(views, timestamp="ts").between(-30, 30).join(name="join")
    elif scenario.job is JobKind.CO_PROCESS:
        half = events.n // 2
        first = source("source", events.columns, half).key_by("user")
        second = source("source-2", lambda i: events.columns(i + half), half).key_by("user")
        result = first.connect(second).process(SideCounts(), name="co-process")
    elif scenario.job is JobKind.BROADCAST:
        rows = source("source", events.columns).key_by("user")
        rules = source("source-2", lambda i: rule_columns(events, i), events.n // RULE_EVERY)
        broadcast = rules.broadcast(RULES)
        assert isinstance(broadcast, rs.BroadcastStream)  # given a descriptor
        result = rows.connect(broadcast).process(Weigh(), name="weigh")
    elif scenario.job in SQL_WINDOWS:
        result = sql_windows(scenario, env, source(
            "source", lambda i: timestamped_columns(events, i)))
    elif scenario.job is JobKind.COUNT_WINDOW:
        result = source("source", events.columns).key_by("user").count_window(40, 20).agg(
            n=("count", None), total=("sum", "x"), name="count-window")
    else:
        windows = source("source", events.columns).key_by("user").window(
            ASSIGNERS[scenario.job], timestamp="ts", allowed_lateness_ms=scenario.lateness_ms,
            late_output="late" if scenario.path is Path.LATE_OUTPUT else None,
            pre_aggregate=scenario.path is Path.PRE_AGGREGATED, trigger=trigger_of(scenario))
        if scenario.path is Path.GENERIC:
            result = windows.aggregate(CountAndSum(), name="window")
        elif scenario.path is Path.PROCESS_WINDOW:
            result = windows.process(CountAndSumRows(), name="window",
                                     schema=window_schema(events))
        else:
            result = windows.agg(n=("count", None), total=("sum", "x"), name="window")
        if scenario.path is Path.LATE_OUTPUT:
            late = result.side_output("late").collect(name="late")
    if scenario.sink is Sink.PARQUET:
        return result.sink_to_parquet(out, name="out"), late
    return result.collect(name="out"), late


# -- running a scenario ----------------------------------------------------------------------

def run_scenario(scenario: Scenario, workdir: str) -> Outcome:
    """Run ``scenario`` with its failures in ``workdir``; compare with the oracles. A job
    that fails or hangs is a difference too (with the failures placed until then)."""
    started = time.monotonic()
    outcome = Outcome(scenario)
    try:
        outcome.differences = _run(scenario, FsPath(workdir), outcome.placed)
    except Exception as exc:
        outcome.differences = [f"{type(exc).__name__}: {exc}"]
    outcome.seconds = time.monotonic() - started
    return outcome


def _run(scenario: Scenario, work: FsPath, placed: list[str]) -> list[str]:
    out = str(work / "out")
    phases: list[list[Failure]] = [[]]
    for failure in scenario.failures:
        phases[-1].append(failure)
        if failure.stops:
            phases.append([])
    parallelism, restore_from = scenario.parallelism, None
    tables, late_tables = [], []
    number = 0
    while number < len(phases):
        phase = phases[number]
        storage = str(work / f"checkpoints-{number}")
        env = environment(scenario, parallelism, storage, failpoints(scenario, phase, parallelism))
        # slowed until this phase's failures are placed, then at full speed to the end
        brake = Brake(str(work), THROTTLE_S)
        sink, late = build(scenario, env, out, brake)
        client = env.execute_async(f"chaos-{scenario.seed}-{number}", restore_from=restore_from)
        result = None
        attempt = 0
        kills: list[Failure] = []  # SIGKILLs after checkpoints, placed in this run
        for failure in phase:
            if failure.stops:
                savepoint = str(work / f"savepoint-{number}")
                stopped = stop(scenario, client, failure, savepoint, parallelism, placed)
                if stopped is None:  # nothing to restore: the phases after this one cannot run
                    phases = phases[:number + 1]
                else:
                    result = stopped
                    restore_from, parallelism = savepoint, failure.new_parallelism
            else:
                placed.append(place(scenario, client, failure, attempt, parallelism, storage))
                if placed[-1].endswith(" after checkpoints") and failure.kind is FailureKind.SIGKILL:
                    kills.append(failure)
                # a subtask's kill, then the master's (whose successor deploys the next)
                attempt += counts_an_attempt(failure) * (
                    2 if failure.kind is FailureKind.MASTER_KILL_IN_RESTORE else 1)
        brake.release()
        corrupted = next((p.split(" ")[1] for p in placed if p.startswith("corrupted ")), None)
        if result is None:
            try:
                result = wait_live(client)
            except rs.JobFailedError as exc:
                if corrupted is None or corrupted not in str(exc):
                    raise
                # Output was committed for the damaged checkpoint: failing, naming the
                # file, is right; falling back past it would commit that output twice.
                placed.append("the job failed naming the corrupted file")
                return []
        if scenario.sink is Sink.COLLECT:
            tables.append(result.table(sink))
        if late is not None:
            late_tables.append(result.table(late))
        local_differences = (local_recovery_differences(scenario, result, kills, parallelism)
                             + region_differences(scenario, result, kills, parallelism))
        if local_differences:
            return local_differences
        origins = [o for row in result.restores for o in row.get("restored_from", {}).values()]
        regions = sum(bool(row.get("region")) for row in result.restores)
        placed.append(f"run {number}: {result.restarts} restarts ({regions} of a region), "
                      f"{origins.count('local')} of {len(origins)} subtask restores local")
        number += 1
    if scenario.sink is Sink.PARQUET:
        tables = [read_committed(out)]
    rows = [r for t in tables for r in t.to_pylist()]
    late_rows = sorted((r["user"], r["ts"]) for t in late_tables for r in t.to_pylist())
    return compare(scenario, rows, late_rows, str(work / "reference"))


def local_recovery_differences(scenario: Scenario, result: rs.JobResult, kills: list[Failure],
                               parallelism: int) -> list[str]:
    """Local recovery after each SIGKILL after checkpoints: the killed subtask's
    replacement (a new process) read storage, never a local copy; on the heap backend
    some survivor restored from its own process's copy (each survivor acknowledged a
    checkpoint of this attempt that has completed since)."""
    differences = []
    for failure in kills:
        operator = operator_of(scenario, failure)
        subtask = failure.subtask % parallelism if failure.target == "keyed" else 0
        rows = [(row, died) for row in result.restores
                if (died := DIED.search(row["failure"])) is not None
                and int(died[1]) == subtask + 1 and operator in died[2].split(" -> ")]
        if not rows:
            continue  # (its death may have been seen as a deployment's or a master's)
        row, died = rows[0]
        origins = row.get("restored_from", {})
        killed = f"{died[2]}[{subtask}]"
        if origins.get(killed) == "local":
            differences.append(f"local recovery: the killed {operator}[{subtask}] reports a "
                               f"local restore: {origins}")
        survivors = [origin for name, origin in origins.items() if name != killed]
        if (scenario.backend is Backend.HEAP and row["checkpoint_id"] is not None
                and not row.get("region")  # a region's survivors restore nothing
                # (a recovery the next failure cut short, before its subtasks reported
                # their restores, says nothing of where they would have restored from)
                and RecoveryStage.RESTORED.value in (row.get("stages") or {})
                and survivors  # (a job of one chained subtask, at p=1, has none)
                and "local" not in survivors):
            differences.append(f"local recovery: no survivor of the SIGKILL of "
                               f"{operator}[{subtask}] restored locally: {origins}")
    return differences


def region_differences(scenario: Scenario, result: rs.JobResult, kills: list[Failure],
                       parallelism: int) -> list[str]:
    """Region failover: a restart of a region restarts one subtask index of the chain and
    nothing else (no survivor restored state, the committer never); and in the regions job
    with aligned checkpoints and nothing else in doubt (no corruption, outage or master
    kill in the run), each SIGKILL after checkpoints restarted the killed subtask's region
    alone, not the job."""
    differences = []
    for row in result.restores:
        region = row.get("region") or []
        indexes = {name.rsplit("[", 1)[1] for name in region}
        if region and (len(indexes) != 1 or any("committer" in name for name in region)
                       or not set(row.get("restored_from", {})) <= set(region)):
            differences.append(f"region failover restarted more than one region: {row}")
    in_doubt = (FailureKind.CORRUPT_NEWEST, FailureKind.STORAGE_OUTAGE, FailureKind.MASTER_KILL,
                FailureKind.MASTER_KILL_IN_RESTORE, FailureKind.MASTER_KILL_IN_STOP)
    if (scenario.job is not JobKind.REGIONS or parallelism < 2
            or scenario.alignment is not Alignment.ALIGNED
            or any(f.kind in in_doubt for f in scenario.failures)):
        return differences
    # each kill's own recovery: the next one naming its subtask that restored a checkpoint
    # (a kill while deploying, before any checkpoint, restarts the job from the start)
    left = [row for row in result.restores if row["checkpoint_id"] is not None]
    for failure in kills:
        subtask = failure.subtask % parallelism if failure.target == "keyed" else 0
        row = next((row for row in left if (died := DIED.search(row["failure"])) is not None
                    and int(died[1]) == subtask + 1 and "map" in died[2].split(" -> ")), None)
        if row is None:
            continue  # (its death may have been seen as a deployment's)
        left.remove(row)
        if row.get("region") != [f"source -> source-throttle -> map -> out[{subtask}]"]:
            differences.append(f"the SIGKILL of subtask {subtask} did not restart its region "
                               f"alone: {row}")
    return differences


def wait_live(client: rs.JobClient) -> rs.JobResult:
    """The job's result, once it ends; :class:`NotLive` (naming what has not finished) if
    it has read all its input and completed a checkpoint since, but not ended within
    ``LIVENESS_S``. A failover starts the clock again: the restored attempt reads anew."""
    given_up = time.monotonic() + TIMEOUT_S
    read: tuple[int, int] | None = None  # (attempt, newest completed) when all was read
    due: float | None = None  # when the job must have ended
    while True:
        try:
            return client.wait(timeout_s=DIAGNOSE_EVERY_S)
        except TimeoutError:
            pass
        try:
            diagnosis = client.diagnosis()
        except Exception as exc:  # the job ended meanwhile (its master is gone): wait says
            # how; or a master that runs no job answers nothing: the deadline still holds
            if time.monotonic() > given_up:
                raise TimeoutError(f"the job had not ended after {TIMEOUT_S} s, and its "
                                   f"master gives no diagnosis: {type(exc).__name__}: "
                                   f"{exc}") from exc
            continue
        newest = diagnosis.newest_completed or 0
        if read is None or read[0] != diagnosis.attempt:
            read, due = ((diagnosis.attempt, newest) if diagnosis.input_read else None), None
        elif due is None and newest > read[1]:
            due = time.monotonic() + LIVENESS_S
        elif due is not None and time.monotonic() > due:
            client.cancel()
            raise NotLive(f"the job read all its input and completed checkpoint {newest} "
                          f"since, but had not ended {LIVENESS_S:g} s later:\n{diagnosis}")
        if time.monotonic() > given_up:
            client.cancel()
            raise TimeoutError(f"the job had not ended after {TIMEOUT_S} s:\n{diagnosis}")


def stop(scenario: Scenario, client: rs.JobClient, failure: Failure, savepoint: str,
         parallelism: int, placed: list[str]):
    """Stop the job with a savepoint (a subtask SIGKILLed meanwhile, for KILL_DURING_STOP):
    its result, or None when the job went on (or had ended) and finishes by itself."""
    if not wait_for_checkpoints(client, failure.after_checkpoints):
        placed.append("stop: the job finished first")
        return None
    killer, victim = None, "a subtask"
    if failure.kind is FailureKind.KILL_DURING_STOP:
        subtask = failure.subtask % parallelism if failure.target == "keyed" else 0
        pid = subtask_pid(client, operator_of(scenario, failure), subtask)
    elif failure.kind is FailureKind.MASTER_KILL_IN_STOP:
        pid, victim = progress(client).get("master_pid"), "the job master"
    else:
        pid = None
    if pid is not None:
        killer = threading.Timer(failure.delay_ms / 1000, _kill_quietly, (pid,))
        killer.start()
    what = (f"stop at p={parallelism}"
            + (f" with a SIGKILL of {victim} after {failure.delay_ms} ms" if killer else ""))
    try:
        result = client.stop_with_savepoint(savepoint, timeout_s=TIMEOUT_S)
    except Exception as exc:  # a stop that failed: the job must go on and finish exactly
        reason = (str(exc).strip().splitlines() or [""])[-1][:160]
        placed.append(f"{what}: failed ({reason}); it goes on")
        return None
    finally:
        if killer is not None:
            killer.join()
    placed.append(f"{what}: stopped; restore at p={failure.new_parallelism}")
    return result


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it had stopped already


def environment(scenario: Scenario, parallelism: int, storage: str,
                failpoints: list[rs.Failpoint]) -> rs.StreamEnvironment:
    alignment = scenario.alignment
    config = rs.CheckpointConfig(
        interval_s=INTERVAL_S, storage=storage, unaligned=alignment is Alignment.UNALIGNED,
        aligned_timeout=0.05 if alignment is Alignment.ALIGNED_TIMEOUT else None,
        max_concurrent=scenario.max_concurrent, state_backend=(
            rs.DiskStateOptions(incremental=True)
            if scenario.backend is Backend.DISK_INCREMENTAL else scenario.backend.value))
    return rs.StreamEnvironment(parallelism=parallelism, checkpoints=config,
                                failpoints=failpoints,
                                # growing delays: a restore retried during a storage
                                # outage must not run out of attempts before it ends
                                restart=rs.RestartStrategy.exponential_backoff(
                                    12, initial_s=0.1, max_s=1.0, multiplier=1.5))


def operator_of(scenario: Scenario, failure: Failure) -> str:
    return KEYED[scenario.job] if failure.target == "keyed" else "source-throttle"


def failpoints(scenario: Scenario, phase: list[Failure], parallelism: int) -> list[rs.Failpoint]:
    """The phase's failpoints, each armed in the attempt its place in the phase gives."""
    armed = []
    for attempt, failure in enumerate(f for f in phase if counts_an_attempt(f)):
        if failure.kind is FailureKind.FAILPOINT:
            subtask = failure.subtask % parallelism if failure.target == "keyed" else 0
            armed.append(rs.Failpoint(failure.point, operator=operator_of(scenario, failure),
                                      subtask=subtask, hit=failure.hit, attempt=attempt,
                                      action=failure.action))
    return armed


def counts_an_attempt(failure: Failure) -> bool:
    """Does the failure end a job attempt? A stop ends the run; a storage outage fails
    the job over only when it outlasts the tolerable checkpoint failures."""
    return not failure.stops and failure.kind is not FailureKind.STORAGE_OUTAGE


def place(scenario: Scenario, client: rs.JobClient, failure: Failure, attempt: int,
          parallelism: int, storage: str) -> str:
    """Carry out ``failure`` in job attempt ``attempt``; say what happened."""
    subtask = failure.subtask % parallelism if failure.target == "keyed" else 0
    operator = operator_of(scenario, failure)
    if failure.kind is FailureKind.STORAGE_OUTAGE:
        if not wait_for_checkpoints(client, failure.after_checkpoints):
            return "outage: the job finished first"
        os.rename(storage, storage + "-away")  # as root, permissions would not stop a write
        FsPath(storage).write_text("not a directory")
        time.sleep(failure.delay_ms / 1000)
        os.unlink(storage)
        os.rename(storage + "-away", storage)
        return f"storage away for {failure.delay_ms} ms"
    if failure.kind is FailureKind.CORRUPT_NEWEST:
        if not wait_for_checkpoints(client, failure.after_checkpoints):
            return "corrupt: the job finished first"
        pid = subtask_pid(client, operator, subtask)
        newest = max(progress(client)["completed_checkpoints"], default=None)
        if pid is None or newest is None:
            return "corrupt: the job finished first"
        path = corrupt_a_state_file(FsPath(storage) / client.job_id / f"chk-{newest}")
        os.kill(pid, signal.SIGKILL)
        return f"corrupted {path} (checkpoint {newest}), then SIGKILL of {operator}[{subtask}]"
    if failure.kind is FailureKind.MASTER_KILL:
        if not (wait_until(client, lambda: progress(client)["attempt"] >= attempt)
                and wait_for_checkpoints(client, failure.after_checkpoints)):
            return "master kill: the job finished first"
        pid = progress(client).get("master_pid")
        if pid is None:
            return "master kill: the job finished first"
        os.kill(pid, signal.SIGKILL)
        return "SIGKILL of the job master after checkpoints"
    if failure.kind is FailureKind.MASTER_KILL_IN_RESTORE:
        return kill_master_in_restore(client, operator, subtask, attempt)
    if failure.kind is FailureKind.FAILPOINT:  # armed: wait until it fired or the job ended
        if wait_until(client, lambda: progress(client)["attempt"] > attempt):
            return f"failpoint {failure.point} in {operator}[{subtask}]"
        return f"failpoint {failure.point}: not reached"
    if failure.kind is FailureKind.DEPLOY_KILL:
        pid = subtask_pid(client, operator, subtask, while_deploying=True)
        if pid is None:
            return "deploy kill: deployed before a subtask could be killed"
        state = client.status()
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL of {operator}[{subtask}] while {state}"
    # SIGKILL: in this attempt, after some checkpoints
    if not wait_until(client, lambda: progress(client)["attempt"] >= attempt):
        return "sigkill: the job finished first"
    if not wait_for_checkpoints(client, failure.after_checkpoints):
        return "sigkill: the job finished first"
    pid = subtask_pid(client, operator, subtask)
    if pid is None:
        return "sigkill: the job finished first"
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILL of {operator}[{subtask}] after checkpoints"


def kill_master_in_restore(client: rs.JobClient, operator: str, subtask: int,
                           attempt: int) -> str:
    """SIGKILL a subtask after a checkpoint, then the job master as soon as the job
    restores from it (RESTARTING, or the next attempt not yet RUNNING)."""
    if not (wait_until(client, lambda: progress(client)["attempt"] >= attempt)
            and wait_for_checkpoints(client, 1)):
        return "master kill in restore: the job finished first"
    pid, master = subtask_pid(client, operator, subtask), progress(client).get("master_pid")
    if pid is None or master is None:
        return "master kill in restore: the job finished first"
    os.kill(pid, signal.SIGKILL)

    def restoring() -> bool:
        now = progress(client)
        return now["status"] != "RUNNING" or now["attempt"] > attempt

    if not wait_until(client, restoring, timeout_s=30):
        return f"SIGKILL of {operator}[{subtask}]; the job finished before its master's"
    status = progress(client)["status"]
    _kill_quietly(master)
    return f"SIGKILL of {operator}[{subtask}], then of the job master while {status}"


def corrupt_a_state_file(checkpoint_dir: FsPath) -> str:
    """Flip one byte in the middle of a state file of the checkpoint; its path."""
    path = min((p for p in checkpoint_dir.iterdir() if p.suffix in (".keyed", ".op")),
               key=lambda p: (p.suffix != ".keyed", p.name))
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return str(path)


# -- oracles ---------------------------------------------------------------------------------

_references: dict[tuple, list] = {}


def compare(scenario: Scenario, rows: list[dict], late_rows: list, reference_dir: str) -> list[str]:
    job = scenario.job
    if job in (JobKind.TUMBLING, JobKind.SLIDING, *SQL_WINDOWS):
        expected, expected_late = window_emissions(scenario.events, ASSIGNERS[job],
                                                   scenario.lateness_ms)
        differences = emission_differences(emissions_of(rows), expected)
        if scenario.path is Path.LATE_OUTPUT and late_rows != expected_late:
            differences.append(f"late output: {len(late_rows)} rows, expected "
                               f"{len(expected_late)}")
        return differences
    if job is JobKind.SESSION:
        return session_differences(scenario, rows, late_rows)
    if job is JobKind.TRIGGERED:
        assigner = ASSIGNERS[job]
        assert isinstance(assigner, rs.TumblingEventTimeWindows)
        return emission_differences(emissions_of(rows), count_trigger_emissions(
            scenario.events, assigner.size_ms, scenario.lateness_ms, TRIGGER_COUNT,
            scenario.trigger_purges))
    if job is JobKind.WINDOW_JOIN:
        events, half = scenario.events, np.arange(scenario.events.n // 2)
        expected = window_join_emissions(
            events, events.columns(half), join_right_columns(events, half,
                                                             right_shift_ms(scenario)),
            scenario.session_gap_ms)
        return emission_differences(join_emissions_of(rows), expected)
    if job is JobKind.REDUCE:
        return running_sum_differences(scenario, rows)
    if job in ROW_MAPS:  # every input row once, with its y
        e = scenario.events.all()
        return row_differences(canonical(rows), canonical(
            [{"user": u, "ts": t, "x": x, "y": 2 * x}
             for u, t, x in zip(e["user"].tolist(), e["ts"].tolist(), e["x"].tolist())]),
            "the input, mapped by numpy")
    if job is JobKind.CO_PROCESS:
        return row_differences(canonical(rows), side_counts(scenario.events), "the numpy model")
    if job is JobKind.BROADCAST:
        return row_differences(canonical(rows), weighed(scenario.events), "the numpy model")
    # the process function: the same job once, without failures
    key = (job, scenario.path, scenario.lateness_ms, scenario.events)
    if key not in _references:
        calm = Scenario(seed=scenario.seed, job=job, path=scenario.path,
                        lateness_ms=scenario.lateness_ms, events=scenario.events, parallelism=2)
        outcome_rows = reference_rows(calm, reference_dir)
        _references[key] = outcome_rows
    return row_differences(canonical(rows), _references[key], "the run without failures")


def session_differences(scenario: Scenario, rows: list[dict], late_rows: list) -> list[str]:
    """Count and sum per (key, session) against the model (tests/chaos/model.py), which
    replays the reader's batches and watermarks: rows late by their own window count
    in the key's open session when they meet it."""
    events, assigner = scenario.events, ASSIGNERS[JobKind.SESSION]
    assert isinstance(assigner, rs.EventTimeSessionWindows)
    e = events.all()
    run = session_run(e["user"], e["ts"], e["x"], events.watermark_seen(), events.batch,
                      assigner.gap_ms, scenario.lateness_ms)
    expected: Emissions = collections.defaultdict(list)
    for key, start, _, values in run.emissions:
        expected[(key, start)].append((len(values), sum(values)))
    differences = emission_differences(emissions_of(rows),
                                       {w: sorted(v) for w, v in expected.items()})
    expected_late = sorted((key, ts) for key, ts, _ in run.late)
    if scenario.path is Path.LATE_OUTPUT and late_rows != expected_late:
        differences.append(f"late output: {len(late_rows)} rows, expected "
                           f"{len(expected_late)}")
    return differences


def join_emissions_of(rows: list[dict]) -> Emissions:
    got = collections.defaultdict(list)
    for r in rows:
        got[(r["user"], r["window_start"])].append((r["n"], r["total"], r["first"], r["last"]))
    return {w: sorted(v) for w, v in got.items()}


def row_differences(got: list[tuple], expected: list[tuple], oracle: str) -> list[str]:
    if got == expected:
        return []
    missing = collections.Counter(expected) - collections.Counter(got)
    extra = collections.Counter(got) - collections.Counter(expected)
    return [f"differs from {oracle}: {sum(missing.values())} rows missing "
            f"(e.g. {list(missing)[:3]}), {sum(extra.values())} extra (e.g. {list(extra)[:3]})"]


def weighed(events) -> list[tuple]:
    """Weigh's output, from the input alone: per key and timer time T, the key's rows up
    to T and the sum of the weights of the rules up to T."""
    columns = events.all()
    rules = rule_columns(events, np.arange(events.n // RULE_EVERY))
    order = np.argsort(rules["ts"], kind="stable")
    rule_ts, weights = rules["ts"][order], np.concatenate([[0.0], np.cumsum(rules["x"][order])])
    rows = []
    for key in np.unique(columns["user"]):
        times = np.sort(columns["ts"][columns["user"] == key])
        for at in np.unique(times + CO_PROCESS_DELAY_MS):
            rows.append({"user": key.item(), "at": int(at),
                         "rows": int(np.searchsorted(times, at, side="right")),
                         "weight": float(weights[np.searchsorted(rule_ts, at, side="right")])})
    return canonical(rows)


def side_counts(events) -> list[tuple]:
    """SideCounts' output, from the input alone: per key and timer time T (a row's time
    plus the delay), the rows of each half of the input with a time at or before T."""
    half = events.n // 2
    columns = events.all()
    rows = []
    for key in np.unique(columns["user"]):
        mine = columns["user"] == key
        first = np.sort(columns["ts"][:half][mine[:half]])
        second = np.sort(columns["ts"][half:][mine[half:]])
        for at in np.unique(np.concatenate([first, second]) + CO_PROCESS_DELAY_MS):
            rows.append({"user": key.item(), "at": int(at),
                         "first": int(np.searchsorted(first, at, side="right")),
                         "second": int(np.searchsorted(second, at, side="right"))})
    return canonical(rows)


def reference_rows(calm: Scenario, workdir: str) -> list[tuple]:
    env = environment(calm, calm.parallelism, os.path.join(workdir, "checkpoints"), [])
    sink, _ = build(calm, env, os.path.join(workdir, "out"), None)
    return canonical(env.execute(f"chaos-reference-{calm.seed}").table(sink).to_pylist())


def canonical(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted(r.items())) for r in rows)


def running_sum_differences(scenario: Scenario, rows: list[dict]) -> list[str]:
    """Per key: updates numbered 1..count once each, every update adding exactly one
    input row of the key, every input row of the key applied once."""
    e = scenario.events.all()
    user, x = e["user"], e["x"]
    by_key = collections.defaultdict(list)
    for r in rows:
        by_key[r["user"]].append((r["n"], r["x"], r["i"]))
    out = []
    keys = sorted(set(user.tolist()))
    if sorted(by_key) != keys:
        out.append(f"keys differ: {len(by_key)} keys in the output, {len(keys)} in the input")
    for key in keys:
        updates = sorted(by_key.get(key, []))
        mine = np.flatnonzero(user == key)
        if [n for n, _, _ in updates] != list(range(1, len(mine) + 1)):
            out.append(f"key {key}: {len(updates)} updates numbered "
                       f"{[n for n, _, _ in updates][:5]}..., expected 1..{len(mine)}")
            continue
        applied = np.diff([0.0] + [v for _, v, _ in updates])
        last = np.array([j for _, _, j in updates])
        if not np.array_equal(np.sort(last), mine) or not np.array_equal(applied, x[last]):
            out.append(f"key {key}: the sums do not add each input row once")
    return out
