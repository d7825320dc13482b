"""The README's PySpark example runs as written, and its results match numpy."""

from __future__ import annotations

import pathlib

import numpy as np

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
HEADING = "## Reading raystream output from PySpark"


def readme_example() -> str:
    """The first ```python block under the heading."""
    text = README.read_text()
    section = text[text.index(HEADING):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


def test_the_readme_pyspark_example_runs(spark, capsys):
    namespace: dict = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)
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
