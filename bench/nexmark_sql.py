"""Nexmark as SQL against the same queries written with the DataStream API: events per
second per query, and their ratio.

Each query that has both forms (the Nexmark project's SQL file, tests/sql/nexmark/, run
through ``env.sql`` unchanged; the hand-written version of
:mod:`raystream.nexmark.queries`) runs on the same first N Nexmark events (``--events``,
default 5,000,000; the default generator settings, 10,000 events per second of event
time), at parallelism 1, checkpointing every second into a temporary directory, into a
sink that drops rows (``blackhole``; ``discard()``) and counts them. The two forms
alternate, ``--rounds`` times (default 2), and each form's best run counts (a busy
machine only slows runs down). Rate = N / ``JobResult.run_s`` (start-up apart). The
two forms' row counts must be equal, or the script exits without a RESULT line.

The SQL forms do what the SQL says: q1's price is a DECIMAL(23, 3) (the hand-written q1
computes a DOUBLE), and the sink casts every column to its declared type.

Prints a table and, last::

    RESULT sql_over_datastream_geomean=<r> sql_over_datastream_min=<r> queries=<n>

Run from the repo root::

    ./dev bench bench/nexmark_sql.py
    ./dev bench bench/nexmark_sql.py --events 1000000 --rounds 1 --queries q0 q2
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import raystream as rs
from raystream.core.ray_start import ensure_ray
from raystream.nexmark import NexmarkConfig, queries

FILES = Path(__file__).resolve().parent.parent / "tests" / "sql" / "nexmark"
QUERIES = ("q0", "q1", "q2", "q11")  # the SQL files with a DataStream version


def ddl(events: int) -> str:
    config = NexmarkConfig()
    text = (FILES / "ddl_gen.sql").read_text()
    for key, value in {"TPS": config.first_event_rate, "EVENTS_NUM": events,
                       "PERSON_PROPORTION": config.person_proportion,
                       "AUCTION_PROPORTION": config.auction_proportion,
                       "BID_PROPORTION": config.bid_proportion}.items():
        text = text.replace("${" + key + "}", str(value))
    return text + ";\n" + (FILES / "ddl_views.sql").read_text().replace(
        "${NEXMARK_TABLE}", "datagen")


def environment(storage: str, interval_s: float) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=interval_s, storage=storage))


def run_sql(name: str, events: int, interval_s: float) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as storage:
        env = environment(storage, interval_s)
        env.sql(ddl(events))
        sink = env.sql((FILES / f"{name}.sql").read_text())[f"nexmark_{name}"]
        result = env.execute(f"nexmark-sql-{name}", progress=False)
        return result.run_s, result.count(sink)


def run_datastream(name: str, events: int, interval_s: float) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as storage:
        env = environment(storage, interval_s)
        sink = queries.QUERIES[name](env, events, NexmarkConfig()).discard()
        result = env.execute(f"nexmark-ds-{name}", progress=False)
        return result.run_s, result.count(sink)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES))
    args = parser.parse_args()
    unknown = set(args.queries) - set(QUERIES)
    if unknown:
        sys.exit(f"no SQL and DataStream pair for {sorted(unknown)}; the pairs: {', '.join(QUERIES)}")
    ensure_ray()
    ratios, lines = {}, []
    for name in args.queries:
        best: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _ in range(args.rounds):
            for form, run in (("datastream", run_datastream), ("sql", run_sql)):
                seconds, rows = run(name, args.events, args.interval_s)
                print(f"  {name} {form}: {seconds:.2f} s, {rows:,} rows", flush=True)
                best[form] = min(best.get(form, math.inf), seconds)
                if counts.setdefault(form, rows) != rows:
                    sys.exit(f"{name} {form}: {rows} rows, then {counts[form]}")
        if counts["sql"] != counts["datastream"]:
            sys.exit(f"{name}: SQL gave {counts['sql']} rows, the DataStream version "
                     f"{counts['datastream']}")
        rates = {form: args.events / seconds for form, seconds in best.items()}
        ratios[name] = rates["sql"] / rates["datastream"]
        lines.append((name, rates["datastream"], rates["sql"], ratios[name], counts["sql"]))
    print(f"{'query':<6} {'datastream ev/s':>16} {'sql ev/s':>12} {'sql/ds':>7} {'rows':>12}")
    for name, ds, sql, ratio, rows in lines:
        print(f"{name:<6} {ds:>16,.0f} {sql:>12,.0f} {ratio:>7.2f} {rows:>12,}")
    print(f"RESULT sql_over_datastream_geomean={geomean(list(ratios.values())):.3f} "
          f"sql_over_datastream_min={min(ratios.values()):.3f} queries={len(ratios)}")


if __name__ == "__main__":
    main()
