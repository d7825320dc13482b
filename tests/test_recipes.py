"""docs/recipes.md: each recipe runs as written, and its output matches pandas over the
same input."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from tests.support.docs import ROOT, example

RECIPES = ROOT / "docs" / "recipes.md"


def run(heading: str) -> dict:
    namespace: dict = {}
    exec(compile(example(RECIPES, heading), str(RECIPES), "exec"), namespace)
    return namespace


def test_late_data_recipe_counts_every_row_in_time_once_and_sends_the_rest_aside(ray_session):
    ns = run("## Late data")
    i = np.arange(1_800)
    rows = pd.DataFrame(ns["clicks"](i))
    # a minute late is beyond any window's lateness here; six seconds late never is
    dropped = ((i % 37 == 36) & (i > 900))
    kept = rows[~dropped].assign(window_start=lambda d: d.ts // 10_000 * 10_000)
    expected = kept.groupby(["user", "window_start"]).size()
    final = ns["final"]
    pd.testing.assert_series_equal(final.sort_index(), expected.rename("count"),
                                   check_dtype=False, check_names=False)
    late = ns["result"].table(ns["too_late"]).to_pandas()
    assert sorted(late.ts) == sorted(rows[dropped].ts)
    # a window that took a 6 s late row after it fired fired again, with the new count
    table = ns["table"]
    assert (table.groupby(["user", "window_start"]).size() > 1).any()


def test_session_recipe_counts_each_session_once(ray_session):
    ns = run("## A keyed process function")
    i = np.arange(2_500)
    rows = pd.DataFrame(ns["clicks"](i)).assign(block=i // 500)
    expected = (rows.groupby(["user", "block"]).agg(clicks=("ts", "size"), last=("ts", "max"))
                .reset_index().assign(ended_at=lambda d: d["last"] + ns["GAP_MS"]))
    got = ns["result"].table(ns["sessions"]).to_pandas().sort_values(["user", "ended_at"])
    want = expected.sort_values(["user", "ended_at"])
    assert got[["user", "ended_at", "clicks"]].values.tolist() == \
        want[["user", "ended_at", "clicks"]].values.tolist()


def test_custom_source_and_sink_recipe_commits_every_square_once(ray_session):
    ns = run("## A source and a sink of your own")
    out = ns["out"]
    names = os.listdir(out)
    assert names and all(name.endswith(".jsonl") for name in names), names  # all committed
    rows = [json.loads(line) for name in names for line in open(os.path.join(out, name))]
    n = np.array(sorted(row["n"] for row in rows))
    assert np.array_equal(n, np.arange(10_000))
    assert all(row["square"] == row["n"] ** 2 for row in rows)
