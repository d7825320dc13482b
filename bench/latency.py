"""The engine's own latency, without Kafka: raystream beside plain Ray actors doing the same.

The job is ``bench/kafka.py``'s latency job with the broker taken out, at
parallelism 2 and ``buffer_timeout_ms=1`` (``--buffer-timeout-ms``), a
checkpoint every second (``--checkpoint-interval-s``, 0 for none)::

    paced source -> key_by("key") -> map (per row, Python) -> latency sink

* ``paced source``: each of the 2 source subtasks emits ``--rate`` / 2 rows
  a second, every millisecond the rows that are due (25 at 50,000 rows/s),
  each stamped with the wall clock in microseconds as it is emitted. Between
  ticks it sleeps in ``emit_next``, as a Kafka source waits in its poll, and
  says it has caught up, so the subtask sends its buffered rows meanwhile;
* ``key_by``: the shuffle, 100 keys;
* ``map``: ``map(lambda row: {...})`` copying the row, the Kafka job's map;
* ``latency sink`` (chained to the map): receive time minus stamp of every row.

The *Ray floor*, in the same run and the same shape: 2 paced source actors
(the same ticks, rows and stamps) call one of 2 map actors per part of each
tick's batch, chosen by the key's key group as ``key_by`` does; a map actor
applies the same per-row function and records receive time minus stamp on
the spot, as the engine's chained sink does. One Ray call per part and tick,
no buffering, no flow control, no checkpoints, no engine: what Ray's actor calls
cost on this machine under the same load. Rows of the first ``--warmup``
seconds are left out of both.

Per run it prints p50, p99 and p99.9 of both, the ratio of the p99s, and the
load average before and after (the machine is shared: compare the two within
one run, not across runs). ``--rounds`` repeats engine and floor in turn;
``--only engine`` (or ``floor``) runs one side; ``--credits`` sets the job's
credits per channel (default 8, the engine's).

    ./dev bench bench/latency.py               # 20 s each at 50,000 rows/s
    ./dev bench bench/latency.py --quick       # smoke check: 5 s each
    ./dev bench bench/latency.py --rounds 2 --rate 20000

Last line (the median over rounds of each figure)::

    RESULT engine_p99_ms=<ms> ray_floor_p99_ms=<ms> over_floor=<engine p99 / floor p99>
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from raystream.actors.operator import SinkOperator, SourceOperator
from raystream.checkpoint.keygroups import DEFAULT_MAX_PARALLELISM, key_groups_of_array
from raystream.core.ray_start import ensure_ray

PARALLELISM = 2
KEYS = 100
TICK_S = 0.001
SCHEMA = pa.schema([("key", pa.int64()), ("seq", pa.int64()), ("sent_us", pa.int64())])


@dataclass(frozen=True)
class Pace:
    """What each of ``PARALLELISM`` sources emits: ``rate / PARALLELISM`` rows a second for
    ``seconds``, a tick's due rows at a time."""

    rate: int  # rows/s over all sources
    seconds: float

    @property
    def per_source(self) -> int:
        return int(self.rate * self.seconds) // PARALLELISM


class Ticks:
    """One source's pacing: sleep to the next tick, then the rows due by then, stamped."""

    def __init__(self, pace: Pace, index: int) -> None:
        self.rate = pace.rate / PARALLELISM
        self.total = pace.per_source
        self.index = index
        self.sent = 0
        self.started: float | None = None

    def next(self) -> pa.RecordBatch | None:
        """The next tick's rows (maybe none yet), or None when all are sent."""
        if self.sent >= self.total:
            return None
        now = time.perf_counter()
        if self.started is None:
            self.started = now
        tick = self.started + (int((now - self.started) / TICK_S) + 1) * TICK_S
        time.sleep(max(0.0, tick - now))
        due = min(self.total, int((time.perf_counter() - self.started) * self.rate))
        local = np.arange(self.sent, due, dtype=np.int64)
        self.sent = due
        seq = local * PARALLELISM + self.index  # global: the sources interleave
        stamp = np.full(len(seq), time.time_ns() // 1000, np.int64)
        return pa.RecordBatch.from_arrays([pa.array(seq % KEYS), pa.array(seq), pa.array(stamp)],
                                          schema=SCHEMA)


def copy_row(row: dict) -> dict:
    return {"key": row["key"], "seq": row["seq"], "sent_us": row["sent_us"]}


def received(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch``'s ``seq`` and receive time minus stamp (us), taken now."""
    now = time.time_ns() // 1000
    sent = batch.column("sent_us").to_numpy()
    return pa.RecordBatch.from_arrays([batch.column("seq"), pa.array(now - sent)],
                                      names=["seq", "latency_us"])


# -- raystream --------------------------------------------------------------------------------
class PacedSource(SourceOperator):
    def __init__(self, name: str, pace: Pace) -> None:
        super().__init__(name)
        self.pace = pace

    def open(self) -> None:
        self.ticks = Ticks(self.pace, self.ctx.subtask_index)

    def emit_next(self) -> bool:
        batch = self.ticks.next()
        if batch is None:
            return False
        if batch.num_rows:
            self.output.emit(batch)
        return True

    def caught_up(self) -> bool:
        return True  # its next emit_next sleeps to the next tick


class LatencySink(SinkOperator):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.parts: list[pa.RecordBatch] = []

    def process_batch(self, batch, input_index=0):
        self.parts.append(received(batch))

    def final_result(self) -> pa.Table:
        return pa.Table.from_batches(self.parts) if self.parts else pa.table(
            {"seq": pa.array([], pa.int64()), "latency_us": pa.array([], pa.int64())})


def run_engine(pace: Pace, buffer_timeout_ms: float, checkpoint_s: float,
               credits: int) -> np.ndarray:
    """Latency (us) by sequence number through the engine."""
    checkpoints = (rs.CheckpointConfig(interval_s=checkpoint_s, storage=tempfile.mkdtemp())
                   if checkpoint_s > 0 else None)
    env = rs.StreamEnvironment(parallelism=PARALLELISM, buffer_timeout_ms=buffer_timeout_ms,
                               checkpoints=checkpoints, credits=credits)
    sink = (env.add_source(lambda name: PacedSource(name, pace), name="paced")
            .key_by("key").map(copy_row, name="map")
            .sink_to(LatencySink, name="latency"))
    table = env.execute("bench-latency").table(sink)
    return by_seq(table, pace)


# -- the Ray floor ----------------------------------------------------------------------------
@ray.remote(num_cpus=0.01)
class FloorMap:
    def __init__(self) -> None:
        self.parts: list[pa.RecordBatch] = []

    def process(self, batch: pa.RecordBatch) -> None:
        out = pa.RecordBatch.from_pylist([copy_row(r) for r in batch.to_pylist()], schema=SCHEMA)
        self.parts.append(received(out))

    def result(self) -> pa.Table:
        return pa.Table.from_batches(self.parts)


@ray.remote(num_cpus=0.01)
class FloorSource:
    def __init__(self, pace: Pace, index: int, maps: list) -> None:
        self.ticks = Ticks(pace, index)
        self.maps = maps

    def run(self) -> None:
        while (batch := self.ticks.next()) is not None:
            if not batch.num_rows:
                continue
            groups = key_groups_of_array(batch.column("key"), max_parallelism=DEFAULT_MAX_PARALLELISM)
            targets = groups * len(self.maps) // DEFAULT_MAX_PARALLELISM
            for target in np.unique(targets).tolist():
                part = batch.filter(pa.array(targets == target))
                self.maps[target].process.remote(part)


def run_floor(pace: Pace) -> np.ndarray:
    """Latency (us) by sequence number through plain Ray actors."""
    maps = [FloorMap.remote() for _ in range(PARALLELISM)]
    sources = [FloorSource.remote(pace, i, maps) for i in range(PARALLELISM)]
    ray.get([a.__ray_ready__.remote() for a in maps + sources])
    ray.get([s.run.remote() for s in sources])
    table = pa.concat_tables(ray.get([m.result.remote() for m in maps]))
    for actor in maps + sources:
        ray.kill(actor)
    return by_seq(table, pace)


# -- figures ----------------------------------------------------------------------------------
def by_seq(table: pa.Table, pace: Pace) -> np.ndarray:
    """Latencies (us) indexed by sequence number; every row must have arrived once."""
    total = pace.per_source * PARALLELISM
    seq = table.column("seq").to_numpy()
    if len(seq) != total or len(np.unique(seq)) != total:
        raise RuntimeError(f"{len(seq):,} rows arrived ({len(np.unique(seq)):,} distinct), "
                           f"{total:,} were sent")
    latency = np.empty(total, np.int64)
    latency[seq] = table.column("latency_us").to_numpy()
    return latency


@dataclass(frozen=True)
class Figures:
    p50: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, latency_us: np.ndarray) -> "Figures":
        ms = latency_us / 1000
        p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
        return cls(float(p50), float(p99), float(p999), float(ms.max()))

    def __str__(self) -> str:
        return (f"p50 {self.p50:6.2f}  p99 {self.p99:6.2f}  p99.9 {self.p999:6.2f}  "
                f"max {self.max:7.2f} ms")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50_000, help="rows/s over both sources")
    parser.add_argument("--seconds", type=float, default=20.0, help="per run, warm-up included")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds left out")
    parser.add_argument("--buffer-timeout-ms", type=float, default=1.0)
    parser.add_argument("--checkpoint-interval-s", type=float, default=1.0,
                        help="the engine job's (0: no checkpoints)")
    parser.add_argument("--credits", type=int, default=8, help="the engine job's per channel")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=("engine", "floor"),
                        help="run one side only (no RESULT line)")
    parser.add_argument("--quick", action="store_true", help="5 s runs, 1 s warm-up")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup = 5.0, 1.0
    ensure_ray()
    pace = Pace(args.rate, args.seconds)
    skip = int(args.warmup * args.rate)
    print(f"{args.rate:,} rows/s for {args.seconds:g} s ({args.warmup:g} s of warm-up left out), "
          f"p={PARALLELISM}, buffer_timeout_ms={args.buffer_timeout_ms:g}, checkpoint every "
          f"{args.checkpoint_interval_s:g} s", flush=True)
    engine, floor = [], []
    for round_ in range(1, args.rounds + 1):
        before = load()
        if args.only != "floor":
            engine.append(Figures.of(run_engine(pace, args.buffer_timeout_ms,
                                                args.checkpoint_interval_s, args.credits)[skip:]))
            print(f"round {round_}  engine     {engine[-1]}", flush=True)
        if args.only != "engine":
            floor.append(Figures.of(run_floor(pace)[skip:]))
            print(f"round {round_}  ray floor  {floor[-1]}", flush=True)
        if args.only:
            print(f"         load average {before} before, {load()} after", flush=True)
            continue
        print(f"         p99 over floor {engine[-1].p99 / floor[-1].p99:.2f}; load average "
              f"{before} before, {load()} after", flush=True)
    if args.only:
        return
    e99 = statistics.median(f.p99 for f in engine)
    f99 = statistics.median(f.p99 for f in floor)
    print(f"RESULT engine_p99_ms={e99:.2f} ray_floor_p99_ms={f99:.2f} over_floor={e99 / f99:.2f}")


if __name__ == "__main__":
    main()
