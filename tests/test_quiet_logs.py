"""``raystream run`` prints raystream's own lines, not Ray's or Spark's start-up chatter.

A fresh process runs a job and starts a Spark session (RayDP), as a user's
script would; its whole output is checked for the lines a user saw before:
Ray's C++ ``gcs_client.cc`` INFO lines (also from RayDP's JVM), Ray's Python
INFO/WARNING lines, log4j's "Reconfiguration failed" and Spark's ``WARN Utils``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

JOB = textwrap.dedent("""
    import raystream as rs

    env = rs.StreamEnvironment(parallelism=2)
    sink = env.from_sequence(1000).collect()
    print("ROWS", env.execute("quiet").table(sink).num_rows)
    spark = rs.spark.session("quiet")
    print("SPARK", spark.range(3).count())
    rs.spark.stop()
""")

NOISE = ("gcs_client.cc", "logging.cc", "INFO worker.py", "authentication_token_setup",
         "Reconfiguration failed", "WARN Utils", "NativeCodeLoader", "Setting default log level")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_job_and_a_spark_session_print_only_their_own_lines(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("RAYSTREAM_LOG", "RAY_ADDRESS")}
    ran = subprocess.run([sys.executable, "-m", "raystream.cli", "run", str(script)],
                         capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    assert "ROWS 1000" in ran.stdout and "SPARK 3" in ran.stdout
    noisy = [line for line in output.splitlines() if any(n in line for n in NOISE)]
    assert not noisy, "\n".join(noisy)
