"""Streaming inference: handwritten digits scored on a pool of Ray actors, exactly once, read by Spark.

A paced source of scans from eight devices: scan ``i`` is digit sample
``(i * 7919) % 1797`` of scikit-learn's bundled ``load_digits`` (no download), its
64 pixels, its true label and an event time. ``map_batches`` runs a support vector
classifier, trained here at start-up on the first 1,200 samples, on a pool of one
or two Ray actors per subtask (each builds its model once); a 10 s tumbling
event-time window per device counts the scans and the correct predictions; the
windows go exactly once to Parquet (checkpoints every 0.5 s); Spark, on Ray
through RayDP, reads the committed files and ranks the devices by accuracy. The
figures are checked against the same classifier applied in this process, with
pandas over the same input.

Run it with ``python examples/streaming_inference.py`` (``--scans``,
``--rows-per-second``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa
from sklearn.datasets import load_digits
from sklearn.svm import SVC

import raystream as rs

DEVICES = 8
BASE_TS = 1_700_000_000_000  # ms since the epoch
SCAN_EVERY_MS = 5  # event time between two scans
WINDOW_MS = 10_000
TRAINED_ON = 1_200  # the first samples train the model; the scans show every sample

DIGITS = load_digits()


def scans(index: np.ndarray) -> dict[str, object]:
    """Scan ``i``: a pure function of ``i``, so a replay after a failure agrees."""
    sample = (index * 7919) % len(DIGITS.target)
    pixels = DIGITS.data[sample].astype(np.float32).reshape(-1)
    return {"scan": index, "device": index % DEVICES, "ts": BASE_TS + index * SCAN_EVERY_MS,
            "label": DIGITS.target[sample].astype(np.int64),
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels), 64)}


def train() -> SVC:
    """The classifier, fitted at start-up (scikit-learn's own digits example)."""
    return SVC(gamma=0.001).fit(DIGITS.data[:TRAINED_ON], DIGITS.target[:TRAINED_ON])


class DigitClassifier:
    """A pool actor's model: built once per actor, then called on Arrow batches."""

    def __init__(self, model: SVC) -> None:
        self.model = model

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        pixels = batch["pixels"].flatten().to_numpy().reshape(-1, 64)
        predicted = self.model.predict(pixels).astype(np.int64)
        correct = (predicted == batch["label"].to_numpy()).astype(np.int64)
        return pa.record_batch({"device": batch["device"], "ts": batch["ts"],
                                "predicted": predicted, "correct": correct})


def paced(rows_per_second: float):
    def pace(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(batch.num_rows / rows_per_second)
        return batch
    return pace


def build_job(env: rs.StreamEnvironment, n: int, rows_per_second: float, model: SVC,
              output: str) -> rs.SinkHandle:
    events = env.from_sequence(n, scans, batch_size=500, num_splits=4, name="scans",
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=1000))
    paced_events = events.map_batches(paced(rows_per_second / env.parallelism), name="pace")
    scored = paced_events.map_batches(DigitClassifier, constructor_args=(model,),
                                      concurrency=(1, 2), num_cpus=0.25, batch_size=250,
                                      name="classify")
    accuracy = scored.key_by("device").window(
        rs.TumblingEventTimeWindows(size_ms=WINDOW_MS), timestamp="ts").agg(
        name="accuracy", scans=("count", None), correct=("sum", "correct"))
    return accuracy.sink_to_parquet(output, name="accuracy-out")


def expected_by_device(n: int, model: SVC) -> pd.DataFrame:
    """The oracle: per device, scans and correct predictions, by the same classifier in
    this process and pandas over the same input."""
    columns = scans(np.arange(n, dtype=np.int64))
    pixels = columns["pixels"].flatten().to_numpy().reshape(-1, 64)  # type: ignore[union-attr]
    frame = pd.DataFrame({"device": columns["device"],
                          "correct": model.predict(pixels) == columns["label"]})
    return frame.groupby("device").agg(scans=("correct", "size"),
                                       correct=("correct", "sum")).astype("int64")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=40_000)
    parser.add_argument("--rows-per-second", type=float, default=20_000)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()

    started = time.perf_counter()
    model = train()
    print(f"model: {type(model).__name__} trained on {TRAINED_ON} digits in "
          f"{time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory() as work:
        output = os.path.join(work, "accuracy")
        env = rs.StreamEnvironment(parallelism=args.parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.5, storage=os.path.join(work, "checkpoints")))
        build_job(env, args.scans, args.rows_per_second, model, output)
        result = env.execute("streaming-inference")
        completed = sum(c.status == "COMPLETED" for c in result.checkpoints)
        print(f"raystream: {args.scans:,} scans classified in {result.run_s:.1f} s "
              f"({completed} checkpoints, exactly-once Parquet output in {output})")

        spark = rs.spark.session("raystream-inference")
        rs.spark.read(spark, output).createOrReplaceTempView("accuracy")  # committed files only
        ranked = spark.sql("""
            SELECT device, count(*) AS windows, sum(scans) AS scans, sum(correct) AS correct,
                   round(sum(correct) / sum(scans), 4) AS accuracy
            FROM accuracy GROUP BY device ORDER BY accuracy DESC, device""")
        print("\nAccuracy per device (Spark SQL over raystream's committed Parquet output):")
        ranked.show()
        rows = ranked.collect()

        expected = expected_by_device(args.scans, model)
        got = {row["device"]: (row["scans"], row["correct"]) for row in rows}
        want = {int(d): (int(r.scans), int(r.correct)) for d, r in expected.iterrows()}
        assert got == want, f"raystream/Spark disagree with scikit-learn and pandas: {got} != {want}"
        print(f"checked against scikit-learn and pandas: {len(got)} devices agree, "
              f"{sum(c for _, c in got.values()):,} of {args.scans:,} scans correct; total "
              f"{time.perf_counter() - started:.1f} s")
        rs.spark.stop()


if __name__ == "__main__":
    main()
