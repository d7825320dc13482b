"""raystream as a library: the wheel holds every package, and jobs run without Spark.

``pip install raystream`` leaves PySpark and RayDP out (they are the ``spark``
extra). The second test runs a job in a fresh interpreter, with its own Ray,
where importing ``pyspark`` or ``raydp`` fails in the driver and in every Ray
worker (a ``sitecustomize`` on ``PYTHONPATH``, which the workers inherit).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("engine", "checkpoint", "actors", "timers", "spark", "raystream")

BLOCK_SPARK = textwrap.dedent("""
    import sys

    class _NoSpark:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pyspark", "raydp"):
                raise ModuleNotFoundError(f"No module named '{name}' (hidden by the test)")
            return None

    sys.meta_path.insert(0, _NoSpark())
""")

JOB_WITHOUT_SPARK = textwrap.dedent("""
    import pyarrow as pa
    import pyarrow.compute as pc
    import raystream as rs

    env = rs.StreamEnvironment(parallelism=2)
    sink = (env.from_sequence(1000)
            .filter_batches(lambda b: pc.equal(pc.bit_wise_and(b["id"], 1), 0))
            .collect())
    table = env.execute("no-spark").table(sink)
    print("ROWS", table.num_rows, "SUM", pc.sum(table["id"]).as_py())
    try:
        rs.spark.session()
    except ImportError as e:
        print("SPARK", e)
    assert "pyspark" not in sys.modules and "raydp" not in sys.modules
""")


@pytest.mark.slow
def test_the_wheel_holds_every_package_and_spark_is_an_extra(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                            "--quiet", "-w", str(tmp_path)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr
    wheel, = tmp_path.glob("raystream-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in SOURCE_FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.relative_to(ROOT / folder).as_posix()
            prefix = "raystream/" if folder == "raystream" else f"raystream/{folder}/"
            assert prefix + relative in names, f"{init} is not in the wheel: list its package " \
                                               f"in pyproject.toml [tool.setuptools]"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    for name in ("pyspark", "raydp"):
        line, = [r for r in requires if r.split(":")[1].strip().startswith(name)]
        assert "extra == \"spark\"" in line, line
    assert any(r.split(":")[1].strip().startswith("ray[default]") for r in requires)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_runs_without_pyspark_and_rs_spark_names_the_extra(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_SPARK)
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RAY_ADDRESS": "local"}
    ran = subprocess.run([sys.executable, "-c", "import sys\n" + JOB_WITHOUT_SPARK],
                         capture_output=True, text=True, env=env, timeout=220, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    evens = [i for i in range(1000) if i % 2 == 0]  # the oracle
    assert f"ROWS {len(evens)} SUM {sum(evens)}" in ran.stdout
    assert "SPARK rs.spark.session() needs pyspark and raydp" in ran.stdout
    assert "pip install 'raystream[spark]'" in ran.stdout
