"""``raystream run`` prints raystream's own lines, not Ray's or Spark's start-up chatter.

A fresh process runs a job and starts a Spark session (RayDP), as a user's
script would; its whole output is checked for the lines a user saw before:
Ray's C++ ``gcs_client.cc`` INFO lines (also from RayDP's JVM), Ray's Python
INFO/WARNING lines, log4j's "Reconfiguration failed" and Spark's ``WARN Utils``.
(tests/test_examples_output.py checks every line of each example.) The raylets' messages
to the driver go to a logger: the wrapper of Ray's printing function, against Ray's own.
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


def test_raylet_messages_to_a_driver_go_to_a_logger(monkeypatch, caplog):
    """Ray's driver thread prints raylet messages through the module function it looks up
    when it prints (so the wrapper sees them); other output passes through."""
    from ray._private import worker

    from raystream.core.logs import RAY_MESSAGES_LOGGER, quiet_raylet_messages

    assert "print_to_stdstream" in worker.listen_error_messages.__code__.co_names
    printed = []
    monkeypatch.delenv("RAYSTREAM_LOG", raising=False)
    monkeypatch.setattr(worker, "print_to_stdstream",
                        lambda data, ignore_prefix: printed.append(data["lines"]))
    quiet_raylet_messages()
    quiet_raylet_messages()  # once only
    warning = "WARNING: 16 PYTHON worker processes have been started on node: ..."
    with caplog.at_level("WARNING", logger=RAY_MESSAGES_LOGGER):
        worker.print_to_stdstream({"lines": [warning], "pid": "raylet", "is_err": False}, False)
        worker.print_to_stdstream({"lines": ["job output"], "pid": 7, "is_err": False}, False)
    assert [r.getMessage() for r in caplog.records if r.name == RAY_MESSAGES_LOGGER] == [warning]
    assert printed == [["job output"]]
