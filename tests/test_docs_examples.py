"""The README's quickstart and the PySpark guide's example run as written, and their
results match pandas/numpy over the same input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.docs import ROOT, example


@pytest.mark.slow
def test_the_readme_quickstart_runs_and_matches_pandas(spark, capsys):
    namespace: dict = {}
    exec(compile(example(ROOT / "README.md", "## Quickstart"), "README.md", "exec"), namespace)
    i = np.arange(200_000)
    clicks = pd.DataFrame({"user": i % 100, "ts": 1_700_000_000_000 + i * 10,
                           "dwell_ms": i * 7 % 30_000})
    engaged = clicks[clicks.dwell_ms > 1000].assign(window_start=lambda d: d.ts // 60_000 * 60_000)
    expected = (engaged.groupby(["user", "window_start"])
                .agg(clicks=("ts", "size"), dwell_ms=("dwell_ms", "sum")).reset_index())
    table = namespace["result"].table(namespace["sink"]).to_pandas()
    got = table.sort_values(["user", "window_start"]).reset_index(drop=True)
    assert (got.window_end - got.window_start == 60_000).all()
    pd.testing.assert_frame_equal(got[["user", "window_start", "clicks", "dwell_ms"]], expected,
                                  check_dtype=False)
    shown = capsys.readouterr().out  # five users' totals from Spark (in no particular order)
    totals = expected.groupby("user").clicks.sum()
    rows = [line.split("|")[1:3] for line in shown.splitlines() if line.startswith("|")]
    assert rows[0] == ["user", "sum(clicks)"] and len(rows) == 6, shown
    assert all(totals[int(user)] == int(total) for user, total in rows[1:]), shown


@pytest.mark.slow
def test_the_pyspark_guide_example_runs(spark, capsys):
    namespace: dict = {}
    path = ROOT / "docs" / "spark.md"
    exec(compile(example(path, "## Reading raystream output from PySpark"), str(path), "exec"),
         namespace)
    assert namespace["spark"] is spark  # rs.spark.session() reuses the running session

    i = np.arange(200_000)
    pages = np.array(["home", "cart", "pay"])[i % 3]
    expected = {p: int((pages == p).sum()) for p in ("cart", "home", "pay")}
    df = namespace["df"]
    assert {r["page"]: r["count"] for r in df.groupBy("page").count().collect()} == expected
    assert df.schema.simpleString() == "struct<user:bigint,ts:timestamp,page:string>"
    assert sorted(r["user"] for r in df.select("user").distinct().collect()) == list(range(100))
    assert namespace["same"] is True
    streamed = spark.table("pages").collect()
    assert {r["page"]: r["count"] for r in streamed} == expected
    n = np.arange(1_000)
    assert [(r["user"], r["sum(n)"]) for r in namespace["sums"].collect()] == [
        (u, int(n[n % 10 == u].sum())) for u in range(10)]
    shown = capsys.readouterr().out
    assert shown.count(f"|home|{expected['home']}|") == 2  # the batch and the streamed counts
