"""Meter readings: a running total per electricity meter, written exactly once to Parquet.

Reading ``i`` (column ``reading``) is a pure function of ``i`` (meter ``i % meters``, ``1 + i * 7919 % 1000``
watt-hours), so a replay after a failure or a restore produces the same rows. Each
reading updates its meter's total (keyed state); every update is a row of the
Parquet output, committed when a checkpoint completes.

Run it here, or on a cluster through the Ray Jobs API::

    raystream run examples/meter_totals.py -- --out /tmp/meters --checkpoints /tmp/meters-chk
    raystream submit examples/meter_totals.py --address http://127.0.0.1:8265 --wait \\
        -- --out s3://bucket/meters --checkpoints s3://bucket/checkpoints

``--rows-per-second`` paces the source like a live feed, so a job runs long enough
to be watched, savepointed and stopped (``raystream stop meter-totals --savepoint ...``)
and resumed (``raystream run examples/meter_totals.py --restore-from ... -- ...``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

import raystream as rs

BATCH_ROWS = 1000


def readings(meters: int):
    def columns(index: np.ndarray) -> dict[str, np.ndarray]:
        return {"reading": index, "meter": index % meters, "wh": 1 + (index * 7919) % 1000}
    return columns


def paced(rows_per_second: float):
    def pace(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(batch.num_rows / rows_per_second)
        return batch
    return pace


def add_reading(total: dict, reading: dict) -> dict:
    return {**reading, "total_wh": total["total_wh"] + reading["total_wh"]}


def build_job(env: rs.StreamEnvironment, *, readings_count: int, meters: int, out: str,
              rows_per_second: float | None) -> rs.SinkHandle:
    stream = env.from_sequence(readings_count, readings(meters), batch_size=BATCH_ROWS,
                               num_splits=4, name="readings")
    if rows_per_second:
        stream = stream.map_batches(paced(rows_per_second / env.parallelism), name="pace")
    updates = stream.map_batches(lambda b: b.append_column("total_wh", b["wh"]), name="start-total")
    totals = updates.key_by("meter").reduce(add_reading, name="per-meter")
    return totals.sink_to_parquet(out, name="totals")


def expected_totals(readings_count: int, meters: int) -> np.ndarray:
    """The oracle: each meter's final total, by numpy over the same readings."""
    columns = readings(meters)(np.arange(readings_count))
    return np.bincount(columns["meter"], weights=columns["wh"], minlength=meters).astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=200_000)
    parser.add_argument("--meters", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--rows-per-second", type=float, default=None)
    parser.add_argument("--checkpoint-interval", type=float, default=1.0)
    parser.add_argument("--out", required=True, help="Parquet output directory or URI")
    parser.add_argument("--checkpoints", required=True, help="checkpoint storage directory or URI")
    args = parser.parse_args()

    env = rs.StreamEnvironment(
        parallelism=args.parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=args.checkpoint_interval,
                                        storage=args.checkpoints))
    build_job(env, readings_count=args.readings, meters=args.meters, out=args.out,
              rows_per_second=args.rows_per_second)
    result = env.execute("meter-totals")
    print(f"meter-totals {result.status}: {args.readings:,} readings of {args.meters} meters in "
          f"{result.run_s:.1f} s, {len(result.checkpoints)} checkpoints, "
          f"{result.restarts} restarts")


if __name__ == "__main__":
    main()
