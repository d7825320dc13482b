"""What a small job costs before its first record and after its last: start-up and teardown.

Most tests and many notebook jobs are small: a few thousand rows, done in well
under a second of processing. Their wall time is start-up (plan, job master,
subtask actors, coordinators, state) and teardown (final checkpoint and commit,
subtasks stopped, actors given back). The job, at parallelism 2, with
checkpoints every 0.25 s into a temp dir (as the tests run them)::

    from_sequence(4,000 rows, 4 splits) -> stamp -> key_by -> reduce -> collect

``stamp`` (a ``map_batches`` step) writes the wall clock of its first and of
its latest batch to files. Per run: *start* is from ``env.execute`` being
called to the first batch at ``stamp``; *teardown* is from the last batch at
``stamp`` to ``env.execute`` returning (the final checkpoint and commit
included). Every run's collected rows are checked against numpy. The first run
starts the driver's pooled subtask actors and its first job master; it is
reported apart (*cold*), and the medians are over the others (*warm*: what
every later job of a session, every test after the first, pays).

The warm runs come twice: *back to back* (the next job is submitted as soon as
the previous returned: its master may still be starting) and *paused*, with
``--pause-s`` between jobs (as between a notebook's cells or a suite's tests:
the driver's next job master has started meanwhile,
:mod:`raystream.engine.master_pool`).

The *Ray floor*, in the same run: the same number of warm actors (as many as
the job has subtasks) are each called once and answer, one after another in a
chain (source → map → sink), and the driver waits for the last answer: what
waking a pipeline of warm Ray actors costs on this machine.

    ./dev bench bench/job_start.py             # 11 runs
    ./dev bench bench/job_start.py --runs 5

Last line::

    RESULT start_s=<median back to back> teardown_s=<median back to back> start_paused_s=<median paused> teardown_paused_s=<median paused> ray_floor_s=<median> start_over_floor=<paused start / floor>
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from raystream.core.ray_start import ensure_ray

ROWS = 4_000
KEYS = 50
PARALLELISM = 2


class Stamp:
    """Forwards batches; writes the wall clock of the first batch and of the latest one."""

    def __init__(self, directory: str) -> None:
        self.first = os.path.join(directory, "first")
        self.last = os.path.join(directory, "last")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        now = repr(time.time())
        if not os.path.exists(self.first):
            with open(self.first, "w") as f:
                f.write(now)
        with open(self.last, "a") as f:
            f.write(now + "\n")
        return batch


def columns(i: np.ndarray) -> dict:
    return {"k": i % KEYS, "v": i}


def add(acc: dict, row: dict) -> dict:
    return {"k": row["k"], "v": acc["v"] + row["v"]}


def one_run(work: str) -> tuple[float, float]:
    """(start s, teardown s) of one job, its output checked against numpy."""
    stamps = tempfile.mkdtemp(dir=work)
    env = rs.StreamEnvironment(parallelism=PARALLELISM, checkpoints=rs.CheckpointConfig(
        interval_s=0.25, storage=tempfile.mkdtemp(dir=work)))
    sink = (env.from_sequence(ROWS, columns, batch_size=100, num_splits=4)
            .map_batches(Stamp(stamps), name="stamp").key_by("k").reduce(add).collect())
    called = time.time()
    result = env.execute("job-start")
    returned = time.time()
    table = result.table(sink)
    i = np.arange(ROWS)
    final = table.to_pandas().groupby("k")["v"].max().sort_index().to_numpy()
    expected = np.bincount(i % KEYS, weights=i).astype(np.int64)
    if table.num_rows != ROWS or not np.array_equal(final, expected):
        raise SystemExit(f"wrong output: {table.num_rows} rows, sums differ from numpy")
    first = float(open(os.path.join(stamps, "first")).read())
    last = max(float(t) for t in open(os.path.join(stamps, "last")).read().split())
    return first - called, returned - last


@ray.remote(num_cpus=0)
class Hop:
    def __init__(self, nxt=None) -> None:
        self.nxt = nxt

    def call(self, x: int) -> int:
        return x + 1 if self.nxt is None else ray.get(self.nxt.call.remote(x + 1))


def ray_floor(runs: int) -> list[float]:
    """Waking a chain of as many warm actors as the job has subtasks (sources, maps, sums)."""
    chain = None
    for _ in range(3 * PARALLELISM):
        chain = Hop.remote(chain)
    assert chain is not None
    ray.get(chain.call.remote(0))  # started and warm
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        ray.get(chain.call.remote(0))
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="jobs per kind (and the cold one)")
    parser.add_argument("--pause-s", type=float, default=1.5, help="between paused jobs")
    args = parser.parse_args()
    ensure_ray(num_cpus=2, log_to_driver=False)
    with tempfile.TemporaryDirectory() as work:
        cold_start, cold_teardown = one_run(work)
        back_to_back = [one_run(work) for _ in range(args.runs - 1)]
        paused = []
        for _ in range(args.runs - 1):
            time.sleep(args.pause_s)
            paused.append(one_run(work))
    floor = statistics.median(ray_floor(args.runs))
    print(f"cold (first job, pooled actors started): start {cold_start:.3f} s, "
          f"teardown {cold_teardown:.3f} s")
    medians = {}
    for kind, runs in (("back to back", back_to_back), (f"paused {args.pause_s} s", paused)):
        medians[kind] = (statistics.median(s for s, _ in runs),
                         statistics.median(t for _, t in runs))
        print(f"warm, {kind}, {len(runs)} runs: start {[round(s, 3) for s, _ in runs]}")
        print(f"warm, {kind}, {len(runs)} runs: teardown {[round(t, 3) for _, t in runs]}")
    print(f"Ray floor (a call through {3 * PARALLELISM} warm actors): {floor * 1000:.1f} ms")
    (start, teardown), (start_paused, teardown_paused) = medians.values()
    print(f"RESULT start_s={start:.3f} teardown_s={teardown:.3f} "
          f"start_paused_s={start_paused:.3f} teardown_paused_s={teardown_paused:.3f} "
          f"ray_floor_s={floor:.4f} start_over_floor={start_paused / floor:.1f}")


if __name__ == "__main__":
    main()
