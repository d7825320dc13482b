"""Float keys: -0.0 is the key 0.0 and every NaN is one key, on both state backends.

Arrow tells -0.0 from 0.0 and NaNs apart by their bits; Python's dict and pandas'
groupby (``dropna=False``) do not. The oracle is pandas over the same rows: a keyed
reduce's running counts of each key are exactly 1..n, and count windows lose no row.
"""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pytest

import raystream as rs

NEGATIVE_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]  # x86's 0*inf
KEYS = [0.0, -0.0, 1.5, float("nan"), NEGATIVE_NAN]


def env_for(backend: str, storage: str) -> rs.StreamEnvironment:
    state = "heap" if backend == "heap" else rs.DiskStateOptions(memory_mb=16)
    return rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=0.2, storage=storage, state_backend=state))


def label(x: float) -> str:
    return "nan" if x != x else repr(x + 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_a_keyed_reduce_keeps_one_state_per_float_key(ray_session, tmp_path, backend):
    rows = [{"x": KEYS[i % len(KEYS)], "v": i + 1, "n": 1} for i in range(500)]
    env = env_for(backend, str(tmp_path / "chk"))
    sink = env.from_collection(rows, batch_size=40).key_by("x").reduce(
        lambda acc, row: {"x": row["x"], "v": acc["v"] + row["v"], "n": acc["n"] + 1},
        name="sum").collect()
    out = env.execute(f"float-reduce-{backend}").table(sink).to_pandas()
    out["key"] = out["x"].map(label)
    frame = pd.DataFrame(rows).assign(key=lambda f: f["x"].map(label))
    expected = frame.groupby("key").agg(n=("n", "sum"), v=("v", "sum"))
    assert set(out["key"]) == set(expected.index) == {"0.0", "1.5", "nan"}
    for key, group in out.groupby("key"):  # one running count per key, each row once
        assert sorted(group["n"]) == list(range(1, expected.loc[key, "n"] + 1)), key
        assert group["v"].max() == expected.loc[key, "v"], key


@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_count_windows_of_float_keys_lose_no_row(ray_session, tmp_path, backend):
    rows = [{"x": [0.0, -0.0, 2.5][i % 3], "v": i + 1} for i in range(600)]
    env = env_for(backend, str(tmp_path / "chk"))
    sink = env.from_collection(rows, batch_size=50).key_by("x").count_window(10).sum(
        "v").collect()
    out = env.execute(f"float-count-windows-{backend}").table(sink).to_pandas()
    frame = pd.DataFrame(rows).assign(key=lambda f: f["x"].map(label))
    sizes = frame.groupby("key").size()  # 400 rows of 0.0, 200 of 2.5: 40 + 20 windows
    assert len(out) == int((sizes // 10).sum()) == 60
    assert out["v"].sum() == frame["v"].sum()
    assert not np.signbit(out["x"]).any()
