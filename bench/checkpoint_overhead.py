"""Cost of checkpoints on a keyed running sum with 1,000,000 keys of state, and recovery time.

The job, at parallelism 2::

    sequence -> offsets -> key_by("key") -> sum -> progress

* ``sequence``: ``from_sequence`` rows ``{"key", "value", "i"}`` in 4 splits.
  The key of row ``i`` is a bijection of its position in its split, spread by
  a multiplicative hash: once every split has read ``KEYS / 4`` rows (about
  the first ``KEYS`` rows of the job, under a tenth of a timed run), every one
  of the ``KEYS`` keys has state.
* ``offsets`` (chained to the source): forwards every batch and reports,
  per split, the largest row index it emitted (the source offset) and the
  first one (where reading started, or resumed after a restore).
* ``sum``: a :class:`raystream.KeyedProcessFunction` keeping the running sum
  of each key in ``ctx.value_state("sum", default=0)``, one read and one
  update per row (the keyed-state path being measured), emitting
  ``{"key", "sum", "i"}`` per row. Its operator also reports how many keys it
  gave state to.
* ``progress`` (chained to ``sum``): a sink that counts rows and reports the
  largest ``i`` per split it has seen.

The operators report through ``Operator.metrics()``, read while the job runs
with ``ray.get(client.subtask_actor(name, k).metrics.remote())``.

Throughput: the same job runs twice in one Ray session, without checkpoints
and with ``CheckpointConfig(interval_s=1.0, storage=<a temp dir>)``; the rate
is ``rows / JobResult.run_s`` (job start-up, ``deploy_s``, apart). Sizing: a
calibration run without checkpoints estimates the rate, then the row count is
sized so each timed run lasts at least 30 s (re-sized and re-run if it falls
short). Each run checks the sink's row count and that every key got
state. The checkpointed run is invalid, and the script exits non-zero without
a RESULT line, if fewer than 20 of its checkpoints COMPLETED. Checkpoint
durations and sizes are those of ``JobResult.checkpoints``.

Recovery: a third, checkpointed job (the same operators, a practically
unbounded sequence, restart without delay:
``RestartStrategy.fixed_delay(attempts, 0)``; ``--restart-delay`` to change
it) fills all keys, then takes ``--kills`` seeded kills, one at a time. Before
each kill it waits for four checkpoints of the current attempt to complete (a
failure of a job in its steady state: caught up after the previous one, a warm
spare started), then sleeps a delay drawn from ``random.Random(seed)`` (uniform
in [0, 2 s), a random phase of the checkpoint cycle), draws which ``sum`` subtask (the
stateful middle of the pipeline) to kill, reads the source offsets, and sends
``SIGKILL`` to the subtask's process (its pid from its metrics). From the kill:

* *detect*: until the job master saw the failure (the wall-clock time of its
  recovery row, ``client.progress()["restores"]``; one machine, one clock);
* the job master's stages of the recovery (engine/recovery.py), each from the
  one before: *cancelled* (the old attempt stopped in the live actors, the dead
  one replaced), *deployed* (the new attempt wired and started), *restored*
  (every subtask restored its state and opened), *first record* (a sink
  processed its first record);
* *catch-up*: until, for every split, the ``progress`` sinks have seen a row
  at or past the source offset read just before the kill.

Recovery time is from the kill until caught up; the RESULT line carries the median over the kills.

Run from the repo root (a full run takes several minutes)::

    ./dev bench bench/checkpoint_overhead.py              # full run: 1,000,000 keys, >= 30 s runs, 3 kills
    ./dev bench bench/checkpoint_overhead.py --seed 7     # other kill times and victims
    ./dev bench bench/checkpoint_overhead.py --quick      # smoke check: small, no minimums, 1 kill

The last line is machine-readable: the checkpointed run's rate over the plain
run's, and the median recovery time::

    RESULT checkpointed_over_plain=<ratio> recovery_s=<median s>
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from raystream.core.ray_start import ensure_ray
from raystream.engine.keys import KeySelector
from raystream.engine.recovery import STAGES
from raystream.actors.credit_limit import DEFAULT_IN_FLIGHT_MS
from raystream.checkpoint.snapshot_stats import PHASES
from raystream.engine.operators.keyed import KeyedProcessOperator
from raystream.actors.operator import SinkOperator
from raystream.engine.sources.sequence import Sequence

RAY_INIT_KWARGS = {"num_cpus": 2, "include_dashboard": False}
PARALLELISM = 2
NUM_SPLITS = 4
CREDITS = 8
KEYS = 1_000_000
QUICK_KEYS = 20_000
INTERVAL_S = 1.0
MIN_RUN_S = 30.0
HEADROOM = 1.15  # size N for this many times MIN_RUN_S, so noise rarely forces a re-run
MIN_CHECKPOINTS = 20
CALIBRATION_ROWS = 2_000_000
QUICK_ROWS = 400_000
RECOVERY_ROWS = 10**12  # the recovery job is cancelled long before it could end
KILL_DELAY_S = (0.0, 2 * INTERVAL_S)
# before each kill: the job is back in its steady state (caught up, its warm spare, which
# starts after 2 checkpoints of an attempt, ready: engine/deployment.py)
CHECKPOINTS_BEFORE_KILL = 4
POLL_S = 0.02
PHASE_TIMEOUT_S = 180.0
MULTIPLIER = 2654435761  # Knuth's multiplicative hash; coprime to KEYS, so a bijection mod KEYS
OUT_SCHEMA = pa.schema([("key", pa.int64()), ("sum", pa.int64()), ("i", pa.int64())])


# -- the job -------------------------------------------------------------------------------

class Rows:
    """``columns`` of the sequence: row ``i`` at position ``p`` of split ``s`` has key
    ``((p * NUM_SPLITS + s) mod keys) * MULTIPLIER mod keys``, so the first ``keys / NUM_SPLITS``
    rows of every split give state to every key exactly once."""

    def __init__(self, n: int, keys: int) -> None:
        if math.gcd(MULTIPLIER, keys) != 1:
            raise ValueError(f"{keys} keys: must be coprime to {MULTIPLIER}")
        self.keys = keys
        self.starts = split_starts(n)

    def __call__(self, index: np.ndarray) -> dict[str, np.ndarray]:
        split = np.searchsorted(self.starts, index, side="right") - 1
        position = index - self.starts[split]
        slot = (position * NUM_SPLITS + split) % self.keys
        return {"key": slot * MULTIPLIER % self.keys, "value": index % 7 + 1, "i": index}


def split_starts(n: int) -> np.ndarray:
    """First row index of each split, as ``from_sequence`` cuts them."""
    return np.array([lo for lo, _ in Sequence(n, num_splits=NUM_SPLITS).splits()], np.int64)


class Offsets(rs.Operator):
    """Forwards batches; reports per split the first and largest row index emitted."""

    def __init__(self, name: str, starts: np.ndarray) -> None:
        super().__init__(name)
        self.starts = starts
        self.first = [-1] * NUM_SPLITS
        self.last = [-1] * NUM_SPLITS
        self.opened = 0

    def open(self) -> None:
        self.opened = 1

    def process_batch(self, batch, input_index=0):
        index = batch.column("i")  # a sequence batch is one contiguous range of one split
        lo, hi = index[0].as_py(), index[len(index) - 1].as_py()
        split = int(np.searchsorted(self.starts, lo, side="right")) - 1
        if self.first[split] < 0:
            self.first[split] = lo
        self.last[split] = max(self.last[split], hi)
        self.output.emit(batch)

    def metrics(self) -> dict[str, float]:
        out = {"opened": self.opened}
        for s in range(NUM_SPLITS):
            out[f"first.{s}"] = self.first[s]
            out[f"last.{s}"] = self.last[s]
        return out


class RunningSum(rs.KeyedProcessFunction):
    """The running sum of ``value`` per key, in value state (values are >= 1)."""

    def open(self, ctx: rs.KeyedContext) -> None:
        self.total = ctx.value_state("sum", default=0)
        self.new_keys = 0

    def process_element(self, row: dict, ctx: rs.KeyedContext):
        state = self.total
        total = state.value()
        if not total:
            self.new_keys += 1
        total += row["value"]
        state.update(total)
        return ({"key": row["key"], "sum": total, "i": row["i"]},)


class SumOperator(KeyedProcessOperator):
    """``key_by(...).process(RunningSum())``, reporting how many keys it gave state to."""

    def metrics(self) -> dict[str, float]:
        return {"new_keys": getattr(self.fn, "new_keys", 0)}


class Progress(SinkOperator):
    """Counts rows and reports the largest row index seen per split."""

    def __init__(self, name: str, starts: np.ndarray) -> None:
        super().__init__(name)
        self.starts = starts
        self.rows = 0
        self.last = np.full(NUM_SPLITS, -1, np.int64)
        self.opened = 0

    def open(self) -> None:
        self.opened = 1

    def process_batch(self, batch, input_index=0):
        index = batch.column("i").to_numpy()
        split = np.searchsorted(self.starts, index, side="right") - 1
        np.maximum.at(self.last, split, index)
        self.rows += batch.num_rows

    def metrics(self) -> dict[str, float]:
        out = {"opened": self.opened, "rows": self.rows}
        for s in range(NUM_SPLITS):
            out[f"last.{s}"] = int(self.last[s])
        return out

    def final_result(self) -> int:
        return self.rows


def build_job(env: rs.StreamEnvironment, n: int, keys: int, batch_size: int) -> rs.SinkHandle:
    starts = split_starts(n)
    source = env.from_sequence(n, columns=Rows(n, keys), batch_size=batch_size,
                               num_splits=NUM_SPLITS, name="sequence")
    offsets = source.transform("offsets", lambda name: Offsets(name, starts))
    selector = KeySelector.of("key")
    summed = offsets.key_by(selector).transform(
        "sum", lambda name: SumOperator(name, RunningSum(), selector, schema=OUT_SCHEMA))
    return summed.sink_to(lambda name: Progress(name, starts), name="progress")


def make_env(storage: str | None, restart: rs.RestartStrategy,
             in_flight_ms: float | None) -> rs.StreamEnvironment:
    checkpoints = None if storage is None else rs.CheckpointConfig(interval_s=INTERVAL_S,
                                                                   storage=storage)
    return rs.StreamEnvironment(parallelism=PARALLELISM, credits=CREDITS, checkpoints=checkpoints,
                                restart=restart, in_flight_ms=in_flight_ms,
                                ray_init_kwargs=RAY_INIT_KWARGS)


def operator_metric(metrics: dict[str, dict[str, float]], name: str) -> float:
    """Sum of one operator metric over every subtask of a finished job."""
    return sum(m.get(name, 0) for m in metrics.values())


# -- timed runs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    checkpointed: bool
    rows: int
    keys: int  # keys that got state
    run_s: float
    startup_s: float
    checkpoints: list[Any] = field(default_factory=list)  # COMPLETED CheckpointStats

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.run_s

    @property
    def label(self) -> str:
        return f"checkpoints every {INTERVAL_S:g} s" if self.checkpointed else "no checkpoints"


def run_timed(checkpointed: bool, keys: int, batch_size: int, storage_root: str,
              in_flight_ms: float | None, rows: int) -> Run:
    storage = tempfile.mkdtemp(prefix="checkpoints-", dir=storage_root) if checkpointed else None
    try:
        env = make_env(storage, rs.RestartStrategy.none(),  # a timed run must not fail over
                       in_flight_ms)
        sink = build_job(env, rows, keys, batch_size)
        result = env.execute(f"bench-sum-{'checkpointed' if checkpointed else 'plain'}")
    finally:
        if storage is not None:
            shutil.rmtree(storage, ignore_errors=True)
    seen = result.count(sink)
    if seen != rows:
        raise SystemExit(f"{'checkpointed' if checkpointed else 'plain'} run: the sink saw "
                         f"{seen:,} rows, expected {rows:,}")
    keyed = int(operator_metric(result.metrics, "sum.new_keys"))
    expected_keys = min(keys, rows)
    if keyed != expected_keys:
        raise SystemExit(f"{keyed:,} keys got state, expected {expected_keys:,}")
    completed = [c for c in result.checkpoints if c.status == "COMPLETED"]
    return Run(checkpointed, rows, keyed, result.run_s, result.deploy_s, completed)


def timed(measure: Callable[[int], Run], rows: int, quick: bool) -> Run:
    """Run with ``rows``; unless quick, re-size and re-run until the run lasts MIN_RUN_S."""
    while True:
        run = measure(rows)
        progress(f"{run.label}: {run.rows:,} rows in {run.run_s:.1f} s "
                 f"({run.rows_per_s:,.0f} rows/s, {len(run.checkpoints)} checkpoints)")
        if quick or run.run_s >= MIN_RUN_S:
            return run
        rows = int(run.rows_per_s * MIN_RUN_S * HEADROOM)


# -- recovery ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recovery:
    """One kill, timed: ``detect_s`` from the kill until the job master saw the failure,
    the master's stages (seconds since it saw it: engine/recovery.py), then ``catch_up_s``
    from the first record a sink processed until the sinks passed the offsets at the kill."""

    victim: str
    delay_s: float
    detect_s: float
    stages: dict[str, float]  # the job master's: cancelled, deployed, restored, first_record
    total_s: float  # from the kill until caught up, measured here
    in_flight: int  # rows the sources had emitted that the sinks had not seen, at the kill
    replayed: int  # rows from the restored source positions to the offsets at the kill
    local: str  # subtasks that restored their state locally, of all ("3/4")

    def stage_s(self, stage: str) -> float:
        """Seconds from the previous stage to ``stage`` (detect: from the kill)."""
        if stage == "detect":
            return self.detect_s
        if stage == "catch_up":
            return self.total_s - self.detect_s - self.stages["first_record"]
        before = STAGE_NAMES[STAGE_NAMES.index(stage) - 1]
        return self.stages[stage] - (self.stages[before] if before != "detect" else 0.0)


# the stages of a recovery, each timed from the one before it: the job master's
# (after its own detection) between the kill's detection and the catch-up
STAGE_NAMES = ("detect", *(stage.value for stage in STAGES[1:]), "catch_up")


class Watcher:
    """Polls a running job's progress and its subtasks' metrics."""

    def __init__(self, client: rs.JobClient) -> None:
        self.client = client
        self.handles: dict[tuple[str, int, int], Any] = {}

    def progress(self) -> dict[str, Any]:
        p = self.client.progress()
        if p["status"] in ("FAILED", "FINISHED", "CANCELED"):
            raise SystemExit(f"recovery job ended early: {p['status']}; failures: {p['failures']}")
        return p

    def metrics(self, operator: str, attempt: int) -> list[dict[str, float]] | None:
        """Metrics of every subtask of ``operator``'s chain in ``attempt``; None until they
        all answer for that attempt."""
        actors = []
        for index in range(PARALLELISM):
            actor = self.handles.get((operator, index, attempt))
            if actor is None:
                try:
                    actor = self.client.subtask_actor(operator, index)
                except ValueError:  # not created yet
                    return None
            actors.append(actor)
        try:
            metrics = ray.get([a.metrics.remote() for a in actors], timeout=10)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return None
        if any(m["attempt"] != attempt for m in metrics):
            return None
        for index, actor in enumerate(actors):
            self.handles[(operator, index, attempt)] = actor
        return metrics

    def until(self, what: str, check: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SystemExit(f"recovery job: no {what} within {PHASE_TIMEOUT_S:g} s; "
                                 f"progress: {self.client.progress()}")
            time.sleep(POLL_S)

    def latest_checkpoint(self) -> int:
        return max(self.progress()["completed_checkpoints"], default=0)


def split_maxima(metrics: list[dict[str, float]], name: str) -> list[int]:
    return [int(max(m[f"{name}.{s}"] for m in metrics)) for s in range(NUM_SPLITS)]


def measure_recovery(keys: int, batch_size: int, kills: int, seed: int, restart_delay_s: float,
                     storage_root: str, in_flight_ms: float | None) -> list[Recovery]:
    rng = random.Random(seed)
    storage = tempfile.mkdtemp(prefix="checkpoints-", dir=storage_root)
    env = make_env(storage, rs.RestartStrategy.fixed_delay(kills + 2, restart_delay_s),
                   in_flight_ms)
    build_job(env, RECOVERY_ROWS, keys, batch_size)
    client = env.execute_async("bench-sum-recovery")
    watch = Watcher(client)
    recoveries: list[Recovery] = []
    try:
        def filled():
            metrics = watch.metrics("sum", 0)
            return metrics is not None and sum(m["sum.new_keys"] for m in metrics) >= keys
        watch.until("state for every key", filled)
        base = watch.latest_checkpoint()
        for attempt in range(kills):
            watch.until(f"{CHECKPOINTS_BEFORE_KILL} checkpoints in attempt {attempt}",
                        lambda: watch.latest_checkpoint() >= base + CHECKPOINTS_BEFORE_KILL)
            delay = rng.uniform(*KILL_DELAY_S)
            victim = rng.randrange(PARALLELISM)
            time.sleep(delay)
            sources, sinks = watch.metrics("offsets", attempt), watch.metrics("sum", attempt)
            if sources is None or sinks is None:
                raise SystemExit(f"recovery job: subtasks of attempt {attempt} do not answer")
            offsets = split_maxima(sources, "offsets.last")
            seen = split_maxima(sinks, "progress.last")
            # the next attempt's checkpoints come after the one the kill may abort
            base = watch.latest_checkpoint() + 1
            killed, killed_at = time.perf_counter(), time.time()
            os.kill(int(sinks[victim]["pid"]), signal.SIGKILL)

            def caught_up():
                sinks = watch.metrics("sum", attempt + 1)
                if sinks is None:
                    return None
                return all(a >= b for a, b in zip(split_maxima(sinks, "progress.last"), offsets))
            watch.until(f"catch-up of attempt {attempt + 1}", caught_up)
            caught_up_s = time.perf_counter() - killed

            def timed():  # the master has timed every stage of this attempt's recovery
                rows = [r for r in watch.progress()["restores"] if r["attempt"] == attempt + 1]
                return rows and "first_record" in rows[-1]["stages"] and rows[-1]
            row = watch.until(f"the stages of recovery {attempt + 1}", timed)
            starts = split_maxima(watch.metrics("offsets", attempt + 1), "offsets.first")
            recovery = Recovery(
                victim=f"sum/{victim}", delay_s=delay, detect_s=row["at"] - killed_at,
                stages=row["stages"], total_s=caught_up_s,
                in_flight=sum(o - s for o, s in zip(offsets, seen)),
                replayed=sum(o - s + 1 for o, s in zip(offsets, starts)),
                local=local_restores(row))
            recoveries.append(recovery)
            progress(f"kill {attempt + 1}/{kills} of {recovery.victim}: recovered in "
                     f"{recovery.total_s:.2f} s ("
                     + ", ".join(f"{n} {recovery.stage_s(n):.2f}" for n in STAGE_NAMES)
                     + f"; restored locally {recovery.local})")
    finally:
        client.cancel()
        try:
            client.wait(timeout_s=120)
        except Exception as exc:  # the measurements stand; say why the job did not end cleanly
            progress(f"recovery job did not end cleanly: {exc}")
        shutil.rmtree(storage, ignore_errors=True)
    return recoveries


def local_restores(row: dict[str, Any]) -> str:
    """How many subtasks of a recovery row restored locally, of all: "3/4"."""
    origins = list(row.get("restored_from", {}).values())
    return f"{origins.count('local')}/{len(origins)}"


# -- reporting -----------------------------------------------------------------------------

def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w)
                        for j, (cell, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_runs(runs: list[Run], plain: Run) -> None:
    """One row per run; for a checkpointed one the median checkpoint's duration, size and
    phases (start delay: from the trigger to a subtask's first barrier)."""
    rows = []
    for run in runs:
        durations = [c.duration_s for c in run.checkpoints]
        sizes = [c.size / 1e6 for c in run.checkpoints]
        phases = [fmt(median_or_none([getattr(c, p) for c in run.checkpoints]), ".2f")
                  for p in PHASES]
        rows.append((run.label, f"{run.rows:,}", f"{run.keys:,}", f"{run.startup_s:.2f}",
                     f"{run.run_s:.1f}", f"{run.rows_per_s:,.0f}",
                     f"{run.rows_per_s / plain.rows_per_s:.1%}",
                     str(len(run.checkpoints)) if run.checkpointed else "-",
                     fmt(median_or_none(durations), ".2f"), fmt(max(durations, default=None), ".2f"),
                     fmt(median_or_none(sizes), ".1f"), *phases))
    print_table(("run", "rows", "keys", "start-up s", "run s", "rows/s", "of plain",
                 "checkpoints", "median ckpt s", "max ckpt s", "median ckpt MB",
                 *(f"{p[:-2].replace('_', ' ')} s" for p in PHASES)), rows)


def print_recoveries(recoveries: list[Recovery]) -> None:
    """One row per kill: each stage's seconds from the stage before it (the job master's
    stages between detect and catch-up), the total from the kill, and the rows involved."""
    med = statistics.median
    rows = [(str(k + 1), r.victim, f"{r.delay_s:.2f}",
             *(f"{r.stage_s(n):.2f}" for n in STAGE_NAMES), f"{r.total_s:.2f}",
             f"{r.in_flight:,}", f"{r.replayed:,}", r.local)
            for k, r in enumerate(recoveries)]
    rows.append(("median", "", "", *(f"{med(r.stage_s(n) for r in recoveries):.2f}"
                                     for n in STAGE_NAMES),
                 f"{med(r.total_s for r in recoveries):.2f}",
                 f"{med(r.in_flight for r in recoveries):,.0f}",
                 f"{med(r.replayed for r in recoveries):,.0f}", ""))
    print_table(("kill", "victim", "delay s", *(f"{n.replace('_', ' ')} s" for n in STAGE_NAMES),
                 "recovery s", "in flight rows", "replayed rows", "restored locally"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke check: {QUICK_KEYS:,} keys, {QUICK_ROWS:,} rows a run, no "
                             f"{MIN_RUN_S:g} s minimum or {MIN_CHECKPOINTS}-checkpoint rule, 1 kill")
    parser.add_argument("--batch-size", type=int, default=4096, help="rows per source batch")
    parser.add_argument("--kills", type=int, default=None, help="seeded kills (default 3; quick: 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times and victims")
    parser.add_argument("--restart-delay", type=float, default=0.0,
                        help="restart strategy delay in s, counted in the restore time")
    parser.add_argument("--recovery-only", action="store_true",
                        help="measure recovery only (no throughput runs, no RESULT line)")
    parser.add_argument("--in-flight-ms", type=float, default=DEFAULT_IN_FLIGHT_MS,
                        help="StreamEnvironment(in_flight_ms=...): the data in flight to a "
                             "subtask, in ms of its input (0: no limit, every credit held)")
    parser.add_argument("--storage", default=tempfile.gettempdir(),
                        help="directory for the checkpoint directories (removed after each job)")
    args = parser.parse_args()
    kills = args.kills if args.kills is not None else (1 if args.quick else 3)
    if args.batch_size < 1 or kills < 1 or args.restart_delay < 0:
        parser.error("--batch-size and --kills must be at least 1, --restart-delay >= 0")
    keys = QUICK_KEYS if args.quick else KEYS
    in_flight_ms = args.in_flight_ms or None

    ensure_ray(**RAY_INIT_KWARGS)  # Ray's own start-up is not job start-up
    if args.recovery_only:
        recoveries = measure_recovery(keys, args.batch_size, kills, args.seed, args.restart_delay,
                                      args.storage, in_flight_ms)
        ray.shutdown()
        print_recoveries(recoveries)
        print(f"median recovery: {statistics.median(r.total_s for r in recoveries):.2f} s")
        return
    plain_run = partial(run_timed, False, keys, args.batch_size, args.storage, in_flight_ms)
    checkpointed_run = partial(run_timed, True, keys, args.batch_size, args.storage, in_flight_ms)
    if args.quick:
        rows = QUICK_ROWS
    else:
        calibration = plain_run(CALIBRATION_ROWS)
        progress(f"calibration: {calibration.rows_per_s:,.0f} rows/s")
        rows = max(int(calibration.rows_per_s * MIN_RUN_S * HEADROOM), keys)
    plain = timed(plain_run, rows, args.quick)
    checkpointed = timed(checkpointed_run, plain.rows, args.quick)
    recoveries = measure_recovery(keys, args.batch_size, kills, args.seed, args.restart_delay,
                                  args.storage, in_flight_ms)
    ray.shutdown()  # flushes the workers' forwarded logs now, not after the RESULT line

    print_runs([plain, checkpointed], plain)
    print()
    print_recoveries(recoveries)
    if not args.quick and len(checkpointed.checkpoints) < MIN_CHECKPOINTS:
        print(f"error: the checkpointed run completed {len(checkpointed.checkpoints)} checkpoints, "
              f"fewer than {MIN_CHECKPOINTS}: its throughput does not measure checkpoint overhead",
              file=sys.stderr)
        raise SystemExit(1)
    ratio = checkpointed.rows_per_s / plain.rows_per_s
    recovery = statistics.median(r.total_s for r in recoveries)
    print(f"RESULT checkpointed_over_plain={ratio:.4f} recovery_s={recovery:.2f}")


if __name__ == "__main__":
    main()
