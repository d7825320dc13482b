"""Throughput of raystream's data plane, beside its single-process limit.

Two pipelines over the same generated rows ``{"id": i, "key": i % 1000, "value": 3 * i}``
(``from_sequence`` with 4 splits):

* ``pass-through``: ``source -> discard`` (chained: one subtask per parallel
  instance, no network);
* ``shuffle``: ``source -> key_by("key") -> discard`` (hash-by-key-group edge:
  every batch is partitioned, ``ray.put`` and sent to a discard subtask).

Each runs on raystream at parallelism 1 and 2. Job start-up (subtask actor
creation and wiring, ``JobResult.deploy_s``) is reported apart from the
steady-state rate, which is ``events / JobResult.run_s``. Ray itself is started
once, before anything is timed.

The *limit* is the same work in this process with numpy/pyarrow and no Ray:
generate the same batches and, for the shuffle, compute each row's key group,
pick its target subtask and split the batch by target (what
``KeyGroupPartitioner.route`` does), then drop the parts. That is the cost of
the work itself on one core, with no engine around it; the "of limit" column
and ``limit_ratio`` say how much of it raystream keeps (at parallelism 2 that
may exceed 100% when two cores are free).

Sizing: a calibration run of 2,000,000 events estimates the rate, then N is
sized so the timed run lasts at least 10 s (re-sized and re-run if it still
falls short). Every run checks that the sink saw exactly N events.

Run from the repo root (a full run takes several minutes)::

    ./dev bench bench/throughput.py                     # full run, batches of 8192 rows
    ./dev bench bench/throughput.py --batch-size 65536  # another batch size
    ./dev bench bench/throughput.py --quick             # smoke check: small N, no minimum

The last line is machine-readable: the shuffle at parallelism 2 on raystream,
its rate over the single-process limit of the same shuffle, and its start-up::

    RESULT shuffle_events_per_s=<events/s> limit_ratio=<raystream/limit> startup_s=<s>
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

import raystream as rs
from raystream.checkpoint.keygroups import DEFAULT_MAX_PARALLELISM, key_groups_of_array
from raystream.core.ray_start import ensure_ray

RAY_INIT_KWARGS = {"num_cpus": 2, "include_dashboard": False}
PIPELINES = ("pass-through", "shuffle")
PARALLELISMS = (1, 2)
NUM_SPLITS = 4
CREDITS = 8
MIN_RUN_S = 10.0
HEADROOM = 1.2  # size N for this many times MIN_RUN_S, so noise rarely forces a re-run
CALIBRATION_EVENTS = 2_000_000
QUICK_EVENTS = 200_000
RAY_WORKER_NICENESS = 15  # Ray's default worker_niceness


def columns(index: np.ndarray) -> dict[str, np.ndarray]:
    """The generated rows, as a function of the row index."""
    return {"id": index, "key": index % 1000, "value": index * 3}


@dataclass(frozen=True)
class Measurement:
    pipeline: str
    runner: str  # "raystream" or "limit"
    parallelism: int | None  # None: the limit of a pipeline that does not depend on it
    batch_size: int
    events: int
    run_s: float
    startup_s: float | None = None  # raystream only

    @property
    def events_per_s(self) -> float:
        return self.events / self.run_s


# -- raystream ---------------------------------------------------------------------------

def run_raystream(pipeline: str, parallelism: int, batch_size: int, events: int) -> Measurement:
    env = rs.StreamEnvironment(parallelism=parallelism, credits=CREDITS,
                               ray_init_kwargs=RAY_INIT_KWARGS)
    source = env.from_sequence(events, columns=columns, batch_size=batch_size,
                               num_splits=NUM_SPLITS)
    sink = (source.key_by("key") if pipeline == "shuffle" else source).discard()
    result = env.execute(f"bench-{pipeline}-p{parallelism}")
    check_count(pipeline, result.count(sink), events)
    return Measurement(pipeline, "raystream", parallelism, batch_size, events, result.run_s,
                       result.deploy_s)


# -- the single-process limit ------------------------------------------------------------

def generate(events: int, batch_size: int) -> Iterator[pa.RecordBatch]:
    """The batches ``from_sequence`` emits: each split cut into ``batch_size`` rows."""
    bounds = np.linspace(0, events, NUM_SPLITS + 1).astype(np.int64).tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        for start in range(lo, hi, batch_size):
            index = np.arange(start, min(start + batch_size, hi), dtype=np.int64)
            yield pa.RecordBatch.from_pydict(columns(index))


def split_by_key_group(batch: pa.RecordBatch, parallelism: int) -> list[pa.RecordBatch]:
    """The parts of ``batch`` per target subtask, as ``KeyGroupPartitioner.route`` cuts them."""
    groups = key_groups_of_array(batch.column("key"), max_parallelism=DEFAULT_MAX_PARALLELISM)
    targets = groups * parallelism // DEFAULT_MAX_PARALLELISM
    if parallelism == 1:  # hashed all the same, as the engine does
        return [batch]
    counts = np.bincount(targets, minlength=parallelism).tolist()
    ordered = batch.take(pa.array(np.argsort(targets, kind="stable")))
    parts: list[pa.RecordBatch] = []
    start = 0
    for count in counts:
        if count:
            parts.append(ordered.slice(start, count))
            start += count
    return parts


def run_limit(pipeline: str, parallelism: int | None, batch_size: int, events: int) -> Measurement:
    """Generate (and for the shuffle, split) every batch, then drop it; see ``limit_key``."""
    started = time.perf_counter()
    seen = 0
    for batch in generate(events, batch_size):
        if parallelism is None:  # pass-through
            seen += batch.num_rows
        else:
            seen += sum(part.num_rows for part in split_by_key_group(batch, parallelism))
    run_s = time.perf_counter() - started
    check_count(f"{pipeline} limit", seen, events)
    return Measurement(pipeline, "limit", parallelism, batch_size, events, run_s)


# -- sizing and reporting ----------------------------------------------------------------

def check_count(what: str, seen: int, events: int) -> None:
    if seen != events:
        raise SystemExit(f"{what}: the sink saw {seen} events, expected {events}")


def timed(measure: Callable[[int], Measurement], quick: bool) -> Measurement:
    """Calibrate, then run with N sized for at least MIN_RUN_S (or once with QUICK_EVENTS)."""
    if quick:
        return measure(QUICK_EVENTS)
    events = CALIBRATION_EVENTS
    while True:
        measurement = measure(events)
        if measurement.run_s >= MIN_RUN_S:
            return measurement
        # run_s < MIN_RUN_S, so this is more than HEADROOM times the last N
        events = int(measurement.events_per_s * MIN_RUN_S * HEADROOM)


def progress(measurement: Measurement) -> None:
    parallelism = "any" if measurement.parallelism is None else measurement.parallelism
    print(f"  {measurement.runner} {measurement.pipeline} p={parallelism}: "
          f"{measurement.events:,} events in {measurement.run_s:.1f} s", file=sys.stderr,
          flush=True)


def limit_key(pipeline: str, parallelism: int | None) -> tuple[str, int | None]:
    """Pass-through work does not depend on the parallelism: its one limit has parallelism None."""
    return pipeline, parallelism if pipeline == "shuffle" else None


def print_table(rows: list[Measurement], limits: dict[tuple[str, int | None], Measurement]) -> None:
    header = ("pipeline", "parallelism", "batch size", "start-up s", "events/s", "events",
              "run s", "of limit")
    lines = [header]
    for m in rows:
        limit = limits[limit_key(m.pipeline, m.parallelism)]
        lines.append((
            m.pipeline if m.runner == "raystream" else f"{m.pipeline}, 1-process limit",
            "-" if m.parallelism is None else str(m.parallelism),
            str(m.batch_size),
            "-" if m.startup_s is None else f"{m.startup_s:.2f}",
            f"{m.events_per_s:,.0f}",
            f"{m.events:,}",
            f"{m.run_s:.1f}",
            f"{m.events_per_s / limit.events_per_s:.1%}",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w)
                        for j, (cell, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke check: {QUICK_EVENTS:,} events a run, "
                             f"no {MIN_RUN_S:g} s minimum")
    parser.add_argument("--batch-size", type=int, default=8192, help="rows per source batch")
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")

    ensure_ray(**RAY_INIT_KWARGS)  # Ray's own start-up is not job start-up
    # Ray runs its workers, so every subtask, at niceness 15: the limit runs at the
    # same priority, so both get the same share of a machine busy with other work.
    os.nice(max(0, RAY_WORKER_NICENESS - os.nice(0)))
    measured: dict[tuple[str, int], Measurement] = {}
    limits: dict[tuple[str, int | None], Measurement] = {}
    for pipeline in PIPELINES:
        for parallelism in PARALLELISMS:
            measured[pipeline, parallelism] = timed(
                partial(run_raystream, pipeline, parallelism, args.batch_size), args.quick)
            progress(measured[pipeline, parallelism])
            key = limit_key(pipeline, parallelism)
            if key not in limits:  # right after its raystream run, so both see the same load
                limits[key] = timed(partial(run_limit, *key, args.batch_size), args.quick)
                progress(limits[key])

    rows: list[Measurement] = []
    for pipeline in PIPELINES:
        rows += [measured[pipeline, p] for p in PARALLELISMS]
        rows += [m for key, m in limits.items() if key[0] == pipeline]
    print_table(rows, limits)
    shuffle = measured["shuffle", max(PARALLELISMS)]
    ratio = shuffle.events_per_s / limits[limit_key("shuffle", shuffle.parallelism)].events_per_s
    print(f"RESULT shuffle_events_per_s={shuffle.events_per_s:.0f} limit_ratio={ratio:.4f} "
          f"startup_s={shuffle.startup_s:.2f}")


if __name__ == "__main__":
    main()
