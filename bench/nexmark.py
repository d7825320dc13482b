"""Nexmark on raystream vs Bytewax: events per second per query.

Every query of :mod:`raystream.nexmark.queries` (q0, q1, q2, q3, q4, q5, q7, q8, q11)
runs on the first N Nexmark events at parallelism 1 and 2, checkpointing every second
(``--interval-s``) into a temporary directory, into an exactly-once **discard**
sink (it counts rows). Rate = N / ``JobResult.run_s``; the job's start-up
(``deploy_s``: actors created, sources opened) is reported apart, and ``ray.init``
is not timed.

N is 10,000,000 (``--events``), or more where a query runs under 10 s: a query first
runs at p=1 on N events; if that took less than ``--min-seconds`` (10), N for that
query becomes ``N x 1.2 x 10 s / its time`` rounded up to a million (a margin),
at most ``--max-events`` (100,000,000), and it runs again at p=1 (and again, while a
run on fewer than the most events still takes under 10 s: on a busy machine the first
estimate can be off); its p=2 run is on the same events. The table, the geomean and the
ratio to Bytewax use those runs; the last sizing run's time is in the notes.

The events are generated inside the job by the vectorized
generator (as Flink's Nexmark generates them in its source): generation is part
of every figure.

The same queries on **Bytewax** (one worker, ``run_main``), where it expresses
them (q0, q1, q2, q5, q7, q11), over the first ``--bytewax-events`` events
(default 1,000,000): its input is a ``DynamicSource`` over the same generator's
Arrow batches, flattened to dict rows (Bytewax's item model; that conversion is
part of its time), then its own operators: ``map``/``filter``; one ``fold_window``
(``SlidingWindower``) counting per auction, then the auctions at the maximum, for q5;
``fold_window`` keeping the highest bids for q7; ``count_window``
(``SessionWindower``) for q11; event clocks with a frozen system clock so the
watermark is pure event time. Its sink counts rows. Bytewax's row counts are
checked against numpy/pandas over the same events.

Prints a table and, last::

    RESULT nexmark_geomean_events_per_s=<p=1 geomean, all queries> over_bytewax_geomean=<geomean over the common queries of p=1 / Bytewax>

Run from the repo root (the ``bench`` extra has Bytewax)::

    ./dev bench bench/nexmark.py                       # 10M events (more if < 10 s), Bytewax 1M
    ./dev bench bench/nexmark.py --events 200000 --bytewax-events 200000 --queries q0 q5 --min-seconds 0
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd

import raystream as rs
from raystream.core.ray_start import ensure_ray
from raystream.nexmark import EventKind, NexmarkConfig, generate, queries

CONFIG = NexmarkConfig()
# Context, not a comparison: Flink's throughput per core, from the example result table of
# nexmark/nexmark's GUIDE_V1.md (commit 6b3646c; 100M events, 3 machines of 8 cores,
# parallelism 8, RocksDB, exactly-once checkpoints every 3 minutes, Flink 1.13-2.0).
FLINK_PER_CORE = {"q0": 155_020, "q1": 157_940, "q2": 175_210, "q3": 152_120, "q4": 34_330,
                  "q5": 22_140, "q7": 12_330, "q8": 146_140, "q11": 39_700}
BATCH = 65_536
BYTEWAX_QUERIES = ("q0", "q1", "q2", "q5", "q7", "q11")


def bids_among(events: int) -> int:
    """How many of the first ``events`` events are bids (the last 46 of every 50)."""
    block = CONFIG.total_proportion
    return events // block * CONFIG.bid_proportion + max(
        0, events % block - (block - CONFIG.bid_proportion))


def sized(events: int, seconds: float, min_seconds: float, max_events: int) -> int:
    """Events for a run of at least ``min_seconds``, from a run of ``events`` that took
    ``seconds`` (1.2 times the estimate, rounded up to a million, at most ``max_events``).

        >>> sized(10_000_000, 2.5, 10, 100_000_000), sized(10_000_000, 11, 10, 100_000_000)
        (48000000, 10000000)
    """
    if seconds >= min_seconds or events >= max_events:
        return events
    wanted = events * min_seconds * 1.2 / seconds
    return max(events, min(max_events, math.ceil(wanted / 1e6) * 1_000_000))


def run_raystream(name: str, events: int, parallelism: int, interval_s: float) -> dict:
    with tempfile.TemporaryDirectory() as storage:
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=interval_s, storage=storage))
        sink = queries.QUERIES[name](env, events, CONFIG).discard()
        result = env.execute(f"nexmark-{name}-p{parallelism}")
        return {"run_s": result.run_s, "deploy_s": result.deploy_s, "rows": result.count(sink),
                "checkpoints": sum(c.status == "COMPLETED" for c in result.checkpoints)}


# -- Bytewax ------------------------------------------------------------------------------------

def bytewax_flow(name: str, events: int):
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import DynamicSource, StatelessSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class BidBatches(StatelessSourcePartition):
        def __init__(self) -> None:
            self.lo = 0

        def next_batch(self):
            if self.lo >= events:
                raise StopIteration()
            hi = min(self.lo + BATCH, events)
            batch = generate(EventKind.BID, self.lo, hi, CONFIG)
            self.lo = hi
            return batch.to_pylist()

    class Bids(DynamicSource):
        def build(self, step_id, worker_index, worker_count):
            return BidBatches()

    counted = [0]

    class Counter(StatelessSinkPartition):
        def write_batch(self, items) -> None:
            counted[0] += len(items)

    class Count(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return Counter()

    align = datetime.fromtimestamp(CONFIG.base_time_ms / 1000, tz=timezone.utc)
    frozen = datetime.now(tz=timezone.utc)

    def clock(ts_of):
        return win.EventClock(ts_of, wait_for_system_duration=timedelta(0),
                              now_getter=lambda: frozen)

    def event_time(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)

    flow = Dataflow(f"nexmark-{name}")
    bids = op.input("bids", flow, Bids())
    if name == "q0":
        out = op.map("q0", bids, lambda b: {k: b[k] for k in
                                            ("auction", "bidder", "price", "date_time", "extra")})
    elif name == "q1":
        out = op.map("q1", bids, lambda b: {"auction": b["auction"], "bidder": b["bidder"],
                                            "price": b["price"] * 0.908,
                                            "date_time": b["date_time"], "extra": b["extra"]})
    elif name == "q2":
        kept = op.filter("q2-filter", bids, lambda b: b["auction"] % 123 == 0)
        out = op.map("q2", kept, lambda b: (b["auction"], b["price"]))
    elif name == "q5":
        # one key, so one clock: per-auction count windows would each keep a clock of
        # their own, close at different times and reach a second windowed stage late
        everyone = op.key_on("all", bids, lambda b: "all")

        def count(acc: dict, b) -> dict:
            acc[b["auction"]] = acc.get(b["auction"], 0) + 1
            return acc

        def merge_counts(a: dict, b: dict) -> dict:
            for auction, num in b.items():
                a[auction] = a.get(auction, 0) + num
            return a

        def at_max(item):
            _, (_, counts) = item
            best = max(counts.values())
            return [(auction, num) for auction, num in counts.items() if num == best]

        hot = win.fold_window(
            "q5", everyone, clock(lambda b: event_time(b["date_time"])),
            win.SlidingWindower(length=timedelta(seconds=10), offset=timedelta(seconds=2),
                                align_to=align), dict, count, merge_counts)
        out = op.flat_map("q5-rows", hot.down, at_max)
    elif name == "q7":
        everyone = op.key_on("all", bids, lambda b: "all")

        def highest(acc, b):
            best, rows = acc
            if b["price"] > best:
                return b["price"], [b]
            if b["price"] == best:
                rows.append(b)
            return acc

        def merge(a, b):
            return a if a[0] > b[0] else b if b[0] > a[0] else (a[0], a[1] + b[1])

        top = win.fold_window("q7", everyone, clock(lambda b: event_time(b["date_time"])),
                              win.TumblingWindower(length=timedelta(seconds=10), align_to=align),
                              lambda: (-1, []), highest, merge)
        out = op.flat_map("q7-rows", top.down, lambda item: item[1][1][1])
    elif name == "q11":
        sessions = win.count_window("q11", bids, clock(lambda b: event_time(b["date_time"])),
                                    win.SessionWindower(gap=timedelta(seconds=10)),
                                    key=lambda b: str(b["bidder"]))
        out = sessions.down
    else:
        raise ValueError(f"no Bytewax version of {name}")
    op.output("count", out, Count())
    return flow, counted


def run_bytewax(name: str, events: int) -> tuple[float, int]:
    from bytewax.testing import run_main

    flow, counted = bytewax_flow(name, events)
    started = time.perf_counter()
    run_main(flow)
    return time.perf_counter() - started, counted[0]


def expected_rows(name: str, events: int) -> int:
    """Result rows of ``name`` over the first ``events`` events, by pandas."""
    bids = generate(EventKind.BID, 0, events, CONFIG).to_pandas()
    if name in ("q0", "q1"):
        return len(bids)
    if name == "q2":
        return int((bids["auction"] % 123 == 0).sum())
    if name == "q5":
        first = bids["date_time"] // 2_000 * 2_000
        windows = pd.concat([bids.assign(start=first - k * 2_000) for k in range(5)])
        counts = windows.groupby(["auction", "start"]).size().reset_index(name="num")
        return int((counts["num"] == counts.groupby("start")["num"].transform("max")).sum())
    if name == "q7":
        window = bids["date_time"] // 10_000
        return int((bids["price"] == bids.groupby(window)["price"].transform("max")).sum())
    if name == "q11":
        bids = bids.sort_values(["bidder", "date_time"], kind="stable")
        new = (bids["bidder"] != bids["bidder"].shift()) | (bids["date_time"].diff() >= 10_000)
        return int(new.sum())
    raise ValueError(name)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--min-seconds", type=float, default=10.0,
                        help="re-run a query on more events if p=1 took less (0: never)")
    parser.add_argument("--max-events", type=int, default=100_000_000)
    parser.add_argument("--bytewax-events", type=int, default=1_000_000)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--queries", nargs="+", default=list(queries.QUERIES))
    parser.add_argument("--no-bytewax", action="store_true")
    args = parser.parse_args()
    unknown = set(args.queries) - set(queries.QUERIES)
    if unknown:
        sys.exit(f"unknown queries {sorted(unknown)}; known: {', '.join(queries.QUERIES)}")
    ensure_ray()
    table, p1, ratios, startup = [], {}, {}, []
    for name in args.queries:
        figures, events, sizing = {}, args.events, ""
        for parallelism in (1, 2):
            m = run_raystream(name, events, parallelism, args.interval_s)
            print(f"  {name} p={parallelism} {events:,} events: {m}", flush=True)
            more = sized(events, m["run_s"], args.min_seconds, args.max_events)
            while parallelism == 1 and more > events:  # again if a busy machine misled it
                sizing = f"; sized by {events:,} events in {m['run_s']:.2f} s"
                startup.append(m["deploy_s"])
                events = more
                m = run_raystream(name, events, parallelism, args.interval_s)
                print(f"  {name} p={parallelism} {events:,} events: {m}", flush=True)
                more = sized(events, m["run_s"], args.min_seconds, args.max_events)
            figures[parallelism] = events / m["run_s"]
            startup.append(m["deploy_s"])
            if name in ("q0", "q1") and m["rows"] != bids_among(events):
                sys.exit(f"{name} p={parallelism}: {m['rows']} rows, expected every bid")
            table.append((name, f"raystream p={parallelism}", events, m["run_s"],
                          figures[parallelism],
                          f"start-up {m['deploy_s']:.2f} s, {m['checkpoints']} checkpoints, "
                          f"{m['rows']:,} rows{sizing if parallelism == 1 else ''}"))
        p1[name] = figures[1]
        if name in BYTEWAX_QUERIES and not args.no_bytewax:
            seconds, rows = run_bytewax(name, args.bytewax_events)
            want = expected_rows(name, args.bytewax_events)
            if rows != want:
                sys.exit(f"Bytewax {name}: {rows} rows, pandas says {want}")
            rate = args.bytewax_events / seconds
            ratios[name] = p1[name] / rate
            table.append((name, "Bytewax 1 worker", args.bytewax_events, seconds, rate,
                          f"{rows:,} rows; raystream p=1 is {ratios[name]:.1f}x"))
            print(f"  {name} Bytewax: {seconds:.2f} s", flush=True)
        if name in FLINK_PER_CORE:
            table.append((name, "Flink, per core", None, None, FLINK_PER_CORE[name],
                          "published (nexmark/nexmark GUIDE_V1.md), context only"))
    print(f"{'query':<6} {'system':<18} {'events':>11} {'seconds':>8} {'events/s':>12}  notes")
    for name, system, n, seconds, rate, note in table:
        n_, s_ = (f"{n:>11,}", f"{seconds:>8.2f}") if n else (f"{'':>11}", f"{'':>8}")
        print(f"{name:<6} {system:<18} {n_} {s_} {rate:>12,.0f}  {note}")
    print(f"fixed start-up per raystream job (deploy_s): median {np.median(startup):.2f} s "
          f"(not in the rates)")
    over = f"{geomean(list(ratios.values())):.1f}" if ratios else "n/a"
    print(f"RESULT nexmark_geomean_events_per_s={geomean(list(p1.values())):.0f} "
          f"over_bytewax_geomean={over}")


if __name__ == "__main__":
    main()
