"""Savepoints restored with the other state backend, on real Ray: a job stopped with a
savepoint at parallelism 2 on one backend, restored at 3 on the other.

Oracle: the output of both runs together equals, window by window and exactly once,
what pandas computes over the whole input (``user_window_sums``,
``user_sessions_oracle`` and ``expected_pairs`` of tests/support/oracles.py), or per
user in sequence order for count windows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from tests.support.inputs import user_events
from tests.support.jobs import rescaled_run
from tests.support.operators import pairs_of
from tests.support.oracles import (expected_pairs, user_sessions_oracle, user_window_rows,
                                    user_window_sums)
from tests.support.pacing import Throttle
from tests.support.pipelines import join_job

throttle = Throttle(0.06)  # about 3.6 s of input: a loaded machine still stops it midway
N = 30_000


def env_on(backend: str, parallelism: int, storage: str) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(
        parallelism=parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=storage, state_backend=backend))


def source(env: rs.StreamEnvironment, parallelism: int):
    src = env.from_sequence(N, user_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    # the first run is stopped midway; the restored one need not wait
    return src.map_batches(throttle, name="throttle") if parallelism == 2 else src


@pytest.mark.parametrize("before, after", [("disk", "heap"), ("heap", "disk")])
def test_tumbling_windows_move_between_backends_at_another_parallelism(ray_session, tmp_path,
                                                                       before, after):
    def job(parallelism: int):
        backend = before if parallelism == 2 else after
        env = env_on(backend, parallelism, str(tmp_path / f"chk{parallelism}"))
        windowed = source(env, parallelism).key_by("user").window(
            rs.TumblingEventTimeWindows(size_ms=1000), timestamp="ts",
            allowed_lateness_ms=300).agg(n=("count", None), total=("sum", "x"))
        return env, windowed.collect()

    got = user_window_rows(rescaled_run(job, tmp_path, f"{before}-to-{after}"))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    pd.testing.assert_frame_equal(got, user_window_sums(user_events, N, 1000),
                                  check_dtype=False)


@pytest.mark.parametrize("before, after", [("disk", "heap"), ("heap", "disk")])
def test_session_windows_move_between_backends_at_another_parallelism(ray_session, tmp_path,
                                                                      before, after):
    gap = 200  # a user's rows are 185 ms apart on average: sessions of several rows

    def job(parallelism: int):
        backend = before if parallelism == 2 else after
        env = env_on(backend, parallelism, str(tmp_path / f"chk{parallelism}"))
        sessions = source(env, parallelism).key_by("user").window(
            rs.EventTimeSessionWindows(gap_ms=gap), timestamp="ts").agg(n=("count", None))
        return env, sessions.collect()

    table = rescaled_run(job, tmp_path, f"sessions-{before}-to-{after}")
    got = (table.to_pandas().rename(columns={"user": "k", "n": "rows"})
           [["k", "window_start", "window_end", "rows"]]
           .sort_values(["k", "window_start"]).reset_index(drop=True))
    rows = pd.DataFrame(user_events(np.arange(N))).rename(columns={"user": "k"})
    want = user_sessions_oracle(rows, "aggregate", gap)[["k", "window_start", "window_end",
                                                         "rows"]]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


@pytest.mark.parametrize("before, after", [("disk", "heap"), ("heap", "disk")])
def test_count_windows_move_between_backends_at_another_parallelism(ray_session, tmp_path,
                                                                    before, after):
    size = 10

    def job(parallelism: int):
        backend = before if parallelism == 2 else after
        env = env_on(backend, parallelism, str(tmp_path / f"chk{parallelism}"))
        # one split: each user's rows reach its subtask in sequence order in both runs
        src = env.from_sequence(N, user_events, batch_size=250, num_splits=1)
        if parallelism == 2:
            src = src.map_batches(throttle, name="throttle")
        tens = src.key_by("user").count_window(size).agg(
            n=("count", None), total=("sum", "x"), name="tens")
        return env, tens.collect()

    table = rescaled_run(job, tmp_path, f"count-{before}-to-{after}")
    got = table.to_pandas().sort_values(["user", "total"]).reset_index(drop=True)
    rows = pd.DataFrame(user_events(np.arange(N)))
    rows["window"] = rows.groupby("user").cumcount() // size
    want = rows.groupby(["user", "window"]).agg(n=("x", "size"), total=("x", "sum"))
    want = (want[want["n"] == size].reset_index()[["user", "n", "total"]]
            .sort_values(["user", "total"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(got[["user", "n", "total"]], want, check_dtype=False)



@pytest.mark.parametrize("before, after", [("disk", "heap"), ("heap", "disk")])
def test_interval_join_rows_move_between_backends_at_another_parallelism(ray_session, tmp_path,
                                                                         before, after):
    n, lower, upper = 12_000, -10, 60

    def job(parallelism: int):
        backend = before if parallelism == 2 else after
        env = env_on(backend, parallelism, str(tmp_path / f"chk{parallelism}"))
        return env, join_job(env, n, lower, upper, pace=throttle if parallelism == 2 else None)

    got = pairs_of(rescaled_run(job, tmp_path, f"join-{before}-to-{after}"))
    assert len(got) == len(set(got))  # no pair twice
    assert set(got) == expected_pairs(n, lower, upper)

class RowCount(rs.ProcessWindowFunction):
    def process(self, key, window, rows):
        yield {"user": key, "window_start": window.start, "n": rows.num_rows,
               "total": float(np.sum(rows["x"].to_numpy()))}


@pytest.mark.parametrize("before, after", [("disk", "heap"), ("heap", "disk")])
def test_windows_of_a_user_function_move_between_backends_at_another_parallelism(
        ray_session, tmp_path, before, after):
    def job(parallelism: int):
        backend = before if parallelism == 2 else after
        env = env_on(backend, parallelism, str(tmp_path / f"chk{parallelism}"))
        windowed = source(env, parallelism).key_by("user").window(
            rs.TumblingEventTimeWindows(size_ms=1000), timestamp="ts").process(
            RowCount(), name="rows")
        return env, windowed.collect()

    got = user_window_rows(rescaled_run(job, tmp_path, f"rows-{before}-to-{after}"))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    want = user_window_sums(user_events, N, 1000)
    pd.testing.assert_frame_equal(got[["user", "window_start", "n", "total"]],
                                  want[["user", "window_start", "n", "total"]],
                                  check_dtype=False)
