"""Workload W1: count per key in tumbling 1 s event-time windows — raystream vs Bytewax vs numpy.

N events (default 10,000,000), K = 1000 keys, event time advancing 0.1 ms per
event (so 10,000 events per window), tumbling 1 s windows, count per key and
window. The input is generated once as Arrow batches (not timed) and handed
to every system unchanged:

* **raystream**, parallelism 1 and 2, checkpointing (``CheckpointConfig``):
  ``env.from_arrow(batches)`` →
  ``key_by("key").window(TumblingEventTimeWindows(1000), timestamp="ts").count()``
  → ``collect()``. The window count runs vectorized; pre-aggregation combines
  per (key, window) before the shuffle. Rate = N / ``JobResult.run_s`` (job
  start-up, ``deploy_s``, reported apart; ``ray.init`` not timed). A run with
  fewer than 5 completed checkpoints is invalid: its figures are printed,
  marked INVALID, and the script exits non-zero without a RESULT line.

  The checkpoint interval: W1 asks for one checkpoint a second *and* at least
  5 completed checkpoints over 10,000,000 events, which only a run slower than
  2,000,000 events/s can have. raystream's runs are faster, so the timed runs
  checkpoint every ``--interval-s`` (default 0.2 s: five times as often as W1
  asks, which only costs raystream) and keep N, the input and the validity
  rule. One more p=1 run at W1's own 1 s interval is printed for comparison,
  outside the RESULT.
  A *per-row* variant puts a Python ``map`` (identity on dict rows) before
  the window.
* **Bytewax** (one worker, ``run_main``): ``TestingSource`` over the same
  batches → ``flat_map`` to ``(key, ts)`` tuples → ``count_window`` with an
  ``EventClock`` and a ``TumblingWindower`` of 1 s. The batch → tuples
  conversion is part of its time: it is how Bytewax consumes Arrow batches.
  Its ``EventClock`` (per key) moves the watermark on with the system clock
  between events, which here made events late and dropped them whenever a
  batch took long; its system clock is frozen (``now_getter``), so its
  watermark is purely event time, like raystream's.
* **numpy** (the limit): one pass computing ``window = ts // 1000`` and a
  ``bincount`` over ``window * K + key``.

All three results are checked equal (per key and window). Prints a table and
a last line::

    RESULT events_per_s=<p=1> events_per_s_p2=<p=2> over_bytewax=<p=1 / Bytewax> of_limit=<p=1 / numpy>

Run from the repo root (installs the ``bench`` extra, which has Bytewax)::

    ./dev bench bench/window_count.py                # full: 10,000,000 events
    ./dev bench bench/window_count.py --events 1000000 --bytewax-events 1000000   # quicker
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

import raystream as rs

KEYS = 1000
BASE_MS = 1_700_000_000_000
WINDOW_MS = 1000
BATCH = 65536


def generate(events: int) -> pa.Table:
    index = np.arange(events, dtype=np.int64)
    keys = (index * 2654435761) % KEYS  # spread, deterministic
    ts = BASE_MS + index // 10  # 0.1 ms per event
    return pa.table({"key": keys, "ts": ts})


def oracle_numpy(table: pa.Table) -> tuple[dict, float]:
    started = time.perf_counter()
    keys = table["key"].to_numpy()
    window = table["ts"].to_numpy() // WINDOW_MS
    first = window.min()
    counts = np.bincount((window - first) * KEYS + keys)
    elapsed = time.perf_counter() - started
    nonzero = np.flatnonzero(counts)
    result = {(int(i % KEYS), int((i // KEYS + first) * WINDOW_MS)): int(counts[i]) for i in nonzero}
    return result, elapsed


def identity_row(row: dict) -> dict:
    return row


def run_raystream(table: pa.Table, parallelism: int, per_row: bool,
                  interval_s: float) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as storage:
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=interval_s, storage=storage))
        stream = env.from_arrow(table, batch_size=BATCH,
                                watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
        if per_row:
            stream = stream.map(identity_row, name="per-row")
        counts = stream.key_by("key").window(rs.TumblingEventTimeWindows(size_ms=WINDOW_MS),
                                             timestamp="ts").count()
        sink = counts.collect()
        result = env.execute(f"w1-p{parallelism}{'-per-row' if per_row else ''}")
        out = result.table(sink)
        completed = sum(c.status == "COMPLETED" for c in result.checkpoints)
        got = dict(zip(zip(out["key"].to_pylist(), out["window_start"].to_pylist()),
                       out["count"].to_pylist()))
        if len(got) != out.num_rows:
            sys.exit(f"raystream p={parallelism}: a window was emitted twice")
        return got, {"run_s": result.run_s, "deploy_s": result.deploy_s,
                     "checkpoints": completed}


def run_bytewax(table: pa.Table) -> tuple[dict, float]:
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower
    from bytewax.testing import TestingSink, TestingSource, run_main

    batches = table.to_batches(max_chunksize=BATCH)
    align = datetime.fromtimestamp(BASE_MS / 1000, tz=timezone.utc)
    out: list = []
    flow = Dataflow("w1")
    inp = op.input("in", flow, TestingSource(batches))
    rows = op.flat_map("rows", inp, lambda b: zip(b.column(0).to_pylist(),
                                                  b.column(1).to_pylist()))
    frozen = datetime.now(tz=timezone.utc)
    clock = EventClock(lambda kv: datetime.fromtimestamp(kv[1] / 1000, tz=timezone.utc),
                       wait_for_system_duration=timedelta(0), now_getter=lambda: frozen)
    windower = TumblingWindower(length=timedelta(milliseconds=WINDOW_MS), align_to=align)
    counted = win.count_window("count", rows, clock, windower, key=lambda kv: str(kv[0]))
    op.output("out", counted.down, TestingSink(out))
    started = time.perf_counter()
    run_main(flow)
    elapsed = time.perf_counter() - started
    result = {}
    for key, (window_id, count) in out:
        start = BASE_MS + window_id * WINDOW_MS
        result[(int(key), start)] = count
    return result, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--bytewax-events", type=int, default=None,
                        help="events for Bytewax (default: --events); its rate is compared")
    parser.add_argument("--interval-s", type=float, default=0.2,
                        help="checkpoint interval of the timed raystream runs (see above)")
    args = parser.parse_args()
    table = generate(args.events)
    expected, numpy_s = oracle_numpy(table)
    rows = []

    rs.StreamEnvironment(parallelism=1)  # starts Ray (not timed)
    figures = {}
    invalid = []  # runs with too few checkpoints: shown, but they void the RESULT
    runs = [(1, False, args.interval_s), (2, False, args.interval_s), (1, True, args.interval_s),
            (1, False, 1.0)]  # the last one: W1's own interval, for comparison only
    for parallelism, per_row, interval_s in runs:
        got, m = run_raystream(table, parallelism, per_row, interval_s)
        print(f"  raystream p={parallelism} per_row={per_row} interval={interval_s} s: {m}",
              flush=True)
        if got != expected:
            sys.exit(f"raystream p={parallelism} per_row={per_row}: result differs from numpy")
        name = (f"raystream p={parallelism}{' per-row map' if per_row else ''}"
                f" ckpt/{interval_s:g}s")
        rate = args.events / m["run_s"]
        note = f"start-up {m['deploy_s']:.2f} s, {m['checkpoints']} checkpoints"
        if interval_s == args.interval_s:
            figures[(parallelism, per_row)] = rate
            if m["checkpoints"] < 5:
                invalid.append(f"{name} completed only {m['checkpoints']} checkpoints (need >= 5)")
                note += " INVALID"
        else:
            note += " (comparison only)"
        rows.append((name, args.events, m["run_s"], rate, note))

    bytewax_events = args.bytewax_events or args.events
    bw_table = table if bytewax_events == args.events else generate(bytewax_events)
    bw_expected = expected if bytewax_events == args.events else oracle_numpy(bw_table)[0]
    got, bytewax_s = run_bytewax(bw_table)
    if got != bw_expected:
        sys.exit("Bytewax: result differs from numpy")
    bytewax_rate = bytewax_events / bytewax_s
    rows.append(("Bytewax, 1 worker", bytewax_events, bytewax_s, bytewax_rate, ""))
    numpy_rate = args.events / numpy_s
    rows.append(("numpy, one pass (limit)", args.events, numpy_s, numpy_rate, ""))

    print(f"{'system':<36} {'events':>11} {'seconds':>9} {'events/s':>13}  notes")
    for name, n, seconds, rate, note in rows:
        print(f"{name:<36} {n:>11,} {seconds:>9.2f} {rate:>13,.0f}  {note}")
    p1, p2, per_row = figures[(1, False)], figures[(2, False)], figures[(1, True)]
    print(f"per-row variant over Bytewax: {per_row / bytewax_rate:.1f}x")
    if invalid:  # the figures are shown, but no RESULT comes from an invalid run
        sys.exit("invalid: " + "; ".join(invalid))
    print(f"RESULT events_per_s={p1:.0f} events_per_s_p2={p2:.0f} "
          f"over_bytewax={p1 / bytewax_rate:.1f} of_limit={p1 / numpy_rate:.4f}")


if __name__ == "__main__":
    main()
