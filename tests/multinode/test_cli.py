"""The ``raystream`` command against a real Ray cluster: `ray start --head` on loopback with
token authentication, jobs submitted through the Ray Jobs API.

Every command runs as a separate process, as a user would run it; the job's
committed Parquet output is checked against numpy over the same readings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from raystream.checkpoint.storage import SAVEPOINT_JOB_KEY, CheckpointStorage
from raystream.spark.commit_log import read_committed
from tests.multinode.ray_clusters import start_ray_head

EXAMPLES = Path(__file__).parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
from meter_totals import expected_totals  # noqa: E402  (the example's own oracle, numpy)

METERS = 50


def job_args(tmp: Path, readings: int, rows_per_second: float | None) -> list[str]:
    args = ["--readings", str(readings), "--meters", str(METERS), "--out", str(tmp / "out"),
            "--checkpoints", str(tmp / "checkpoints"), "--checkpoint-interval", "0.5"]
    return args + (["--rows-per-second", str(rows_per_second)] if rows_per_second else [])


def assert_exactly_once(out: Path, readings: int) -> None:
    table = read_committed(str(out))
    ids = np.sort(table["reading"].to_numpy())
    assert len(ids) == readings and (ids == np.arange(readings)).all(), "lost or duplicated rows"
    totals = table.group_by("meter").aggregate([("total_wh", "max")]).sort_by("meter")
    assert (totals["total_wh_max"].to_numpy() == expected_totals(readings, METERS)).all()


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


RAY_INFO_LOG = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+INFO ")  # ray.init's "Connecting to ..."


def one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not RAY_INFO_LOG.match(line)]
    assert len(lines) == 1, f"not one line:\n{result.stderr}"
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def wait_until(condition, timeout_s: float = 90, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def job_id_from_list(head, name: str, status: str) -> str | None:
    jobs = json.loads(ok(head.run("raystream", "list", "--json")))
    found = [job["job_id"] for job in jobs if job["name"] == name and job["status"] == status]
    return found[-1] if found else None


def completed_checkpoints(head, job: str) -> list[int]:
    history = json.loads(ok(head.run("raystream", "checkpoints", job, "--json")))
    return [c["checkpoint_id"] for c in history if c["status"] == "COMPLETED"]


@pytest.mark.deadline(270)  # a submission and seven commands, each seconds on a busy machine
def test_submit_through_the_jobs_api_then_list_status_and_checkpoints(ray_head, tmp_path):
    readings = 100_000  # at 20,000 rows/s: long enough to show progress
    submitted = ray_head.run(
        "raystream", "submit", str(EXAMPLES / "meter_totals.py"), "--address",
        ray_head.dashboard_url, "--wait", "--progress-every", "1", "--",
        *job_args(tmp_path, readings, rows_per_second=20_000), timeout=180)
    output = ok(submitted)
    submission = re.search(r"submitted (raysubmit_\w+)", output).group(1)
    assert re.search(r"raystream: \[ *\d+ s\] meter-totals .*[\d,]+(/[\d,]+)? rows \|",
                     output), output  # progress lines: the submission's log is no terminal
    assert f"submission {submission} SUCCEEDED" in output
    assert_exactly_once(tmp_path / "out", readings)

    job_id = job_id_from_list(ray_head, "meter-totals", "FINISHED")
    assert job_id is not None
    listed = ok(ray_head.run("raystream", "list"))
    assert re.search(rf"^{job_id}\s+meter-totals\s+FINISHED\s", listed, re.M), listed
    status = ok(ray_head.run("raystream", "status", job_id))
    assert re.search(r"^status\s+FINISHED$", status, re.M)
    assert re.search(rf"^submission\s+{submission}$", status, re.M)
    # its final progress: every reading read, of as many as the source had
    assert re.search(r"^phase\s+finished$", status, re.M), status
    assert re.search(rf"^read\s+{readings:,} of {readings:,} rows \(100%\)", status, re.M), status
    # every reading reached the keyed operator, in subtasks of the same chain
    metrics = json.loads(ok(ray_head.run("raystream", "metrics", job_id, "--json")))
    keyed = [m for name, m in metrics.items() if name.startswith("per-meter")]
    assert len(keyed) == 2 and sum(m["records_in"] for m in keyed) == readings

    history = ok(ray_head.run("raystream", "checkpoints", job_id))
    assert "START DELAY" in history.splitlines()[0]  # where each checkpoint's time went
    first = piped_into_head(ray_head, "raystream", "checkpoints", job_id)
    assert first.stdout.splitlines() == [history.splitlines()[0]], first.stdout
    completed = completed_checkpoints(ray_head, job_id)
    retained = CheckpointStorage(str(tmp_path / "checkpoints")).completed_checkpoint_ids(job_id)
    assert retained and set(retained) <= set(completed), (retained, completed)
    for n in retained:
        assert re.search(rf"^{n}\s+COMPLETED\s", history, re.M), history


@pytest.mark.slow
def test_savepoint_stop_and_restore_from_the_command_line(ray_head, tmp_path):
    # at 10,000 rows/s: 45 s, stopped long before its end even when every command takes
    # seconds to connect (seen: at 20 s it ended before the first savepoint on a loaded machine)
    readings = 450_000
    args = job_args(tmp_path, readings, rows_per_second=10_000)
    ok(ray_head.run("raystream", "submit", str(EXAMPLES / "meter_totals.py"), "--address",
                    ray_head.dashboard_url, "--", *args))
    job_id = wait_until(lambda: job_id_from_list(ray_head, "meter-totals", "RUNNING"),
                        what="the job to run")
    wait_until(lambda: completed_checkpoints(ray_head, job_id), what="a checkpoint")

    savepoint = tmp_path / "savepoint-running"
    assert "savepoint written to" in ok(ray_head.run("raystream", "savepoint", job_id,
                                                     str(savepoint)))
    assert CheckpointStorage(str(savepoint)).completed_checkpoint_ids(SAVEPOINT_JOB_KEY)
    assert "RUNNING" in ok(ray_head.run("raystream", "status", job_id))  # it keeps running

    stopped = tmp_path / "savepoint-stop"
    assert "FINISHED" in ok(ray_head.run("raystream", "stop", job_id, "--savepoint", str(stopped)))
    assert re.search(r"^status\s+FINISHED$", ok(ray_head.run("raystream", "status", job_id)), re.M)
    assert CheckpointStorage(str(stopped)).completed_checkpoint_ids(SAVEPOINT_JOB_KEY)
    partial = read_committed(str(tmp_path / "out")).num_rows
    assert 0 < partial < readings, "the stop did not stop the job early"

    # resume from the savepoint, unpaced, as a driver of the same cluster
    resumed = ray_head.run("raystream", "run", str(EXAMPLES / "meter_totals.py"), "--restore-from",
                           str(stopped), "--", *job_args(tmp_path, readings, None), timeout=180)
    assert "meter-totals FINISHED" in ok(resumed)
    assert_exactly_once(tmp_path / "out", readings)


def master_pid(head, job: str) -> int:
    """The pid of the job's master process, asked of the cluster as another client."""
    script = ("import ray, raystream as rs; ray.init(address='auto', logging_level='ERROR'); "
              f"print(rs.JobClient.attach({job!r}).progress()['master_pid'])")
    return int(ok(head.run(sys.executable, "-c", script)).split()[-1])


@pytest.mark.slow
def test_a_detached_job_outlives_its_killed_driver_and_job_master(ray_head, tmp_path):
    readings = 450_000  # at 15,000 rows/s: about 30 s, most of it after the driver is gone
    command = ["raystream", "run", "--detach", str(EXAMPLES / "meter_totals.py"), "--",
               *job_args(tmp_path, readings, rows_per_second=15_000)]
    driver = subprocess.Popen(command, env=ray_head.env, cwd=Path(__file__).parents[2],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job_id = wait_until(lambda: job_id_from_list(ray_head, "meter-totals", "RUNNING"),
                            what="the job to run")
        wait_until(lambda: completed_checkpoints(ray_head, job_id), what="a checkpoint")
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert job_id_from_list(ray_head, "meter-totals", "RUNNING") == job_id, "it ended too early"
    # then its master's process: Ray restarts it (from the constructor arguments Ray kept,
    # the driver being gone), and it takes the job over from the newest checkpoint
    os.kill(master_pid(ray_head, job_id), signal.SIGKILL)
    wait_until(lambda: job_id_from_list(ray_head, "meter-totals", "FINISHED") == job_id,
               timeout_s=180, what="the job to finish without its driver and first master")
    status = ok(ray_head.run("raystream", "status", job_id))
    assert "the job master's process died" in status, status
    assert_exactly_once(tmp_path / "out", readings)


@pytest.mark.slow
def test_cancel_a_running_job(ray_head, tmp_path):
    ok(ray_head.run("raystream", "submit", str(EXAMPLES / "meter_totals.py"), "--address",
                    ray_head.dashboard_url, "--",
                    *job_args(tmp_path, 1_000_000, rows_per_second=10_000)))
    job_id = wait_until(lambda: job_id_from_list(ray_head, "meter-totals", "RUNNING"),
                        what="the job to run")
    assert "CANCELED" in ok(ray_head.run("raystream", "cancel", job_id))
    assert re.search(r"^status\s+CANCELED$", ok(ray_head.run("raystream", "status", job_id)), re.M)


def piped_into_head(head, *command: str) -> subprocess.CompletedProcess:
    """``COMMAND | head -1`` in bash with pipefail: the command's own exit status counts.
    It ends quietly, with 0 (it wrote before head left) or 141 (the pipe had closed)."""
    result = subprocess.run(["bash", "-o", "pipefail", "-c", f"{shlex.join(command)} | head -1"],
                            env=head.env, capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 141), f"exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    return result


def into_a_closed_pipe(head, *command: str) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader left before it wrote a byte."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(list(command), env=head.env, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, cwd=Path(__file__).parents[2])
    finally:
        os.close(write)


def test_a_closed_pipe_ends_a_command_quietly(ray_head):
    result = into_a_closed_pipe(ray_head, "raystream", "list", "--json")
    assert result.returncode == 141, f"exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert piped_into_head(ray_head, "raystream", "list").stdout.count("\n") == 1


@pytest.mark.slow
def test_without_an_address_the_cli_joins_raystreams_ray_and_never_an_unrelated_one(tmp_path):
    # a plain `ray start --head` on loopback in a temp directory of its own; the commands
    # look there (RAY_TMPDIR), not in /tmp/ray, where other Rays of this machine may run
    head = start_ray_head(num_cpus=1)
    try:
        here = {"RAY_ADDRESS": None, "RAY_TMPDIR": str(head.directory)}
        found = head.run("raystream", "list", env=here, timeout=30)
        one_line_error(found, f"the Ray at {head.gcs_address} has never run raystream",
                       "--address", "RAY_ADDRESS")
        without_token = {**here, "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": None}
        one_line_error(head.run("raystream", "status", "some-job", env=without_token, timeout=30),
                       f"the Ray at {head.gcs_address} refused this client", "RAY_AUTH_MODE=token")
        one_line_error(head.run("raystream", "submit", str(EXAMPLES / "meter_totals.py"), env=here,
                                timeout=30), f"the Ray at {head.gcs_address} has never run raystream")
        empty = {**here, "RAY_TMPDIR": str(tmp_path)}
        one_line_error(head.run("raystream", "list", env=empty, timeout=30),
                       "no Ray cluster runs on this machine", "--address", "RAY_ADDRESS")

        # a raystream driver joins it (RAY_ADDRESS): from then on it is raystream's
        ok(head.run(sys.executable, "-c", "from raystream.core.ray_start import ensure_ray; "
                                          "ensure_ray()", timeout=60))
        assert ok(head.run("raystream", "list", env=here, timeout=30)).strip() == (
            "no raystream jobs on this Ray cluster")
        # with RAY_AUTH_MODE unset and a token at hand, as ray.init() finding a local Ray
        token_at_hand = {**here, "RAY_AUTH_MODE": None}
        assert "no raystream jobs" in ok(head.run("raystream", "list", env=token_at_hand, timeout=30))
        # and submit finds its Jobs API
        script = tmp_path / "hello.py"
        script.write_text("print('hello from the cluster')\n")
        submitted = ok(head.run("raystream", "submit", str(script), "--wait", env=here, timeout=120))
        assert "hello from the cluster" in submitted and "SUCCEEDED" in submitted, submitted
    finally:
        head.stop()
        shutil.rmtree(head.directory, ignore_errors=True)


def test_errors_are_one_line(ray_head, tmp_path):
    one_line_error(ray_head.run("raystream", "status", "no-such-job"), "no job 'no-such-job'")
    one_line_error(ray_head.run("raystream", "run", str(tmp_path / "missing.py")),
                   "no job script")
    one_line_error(ray_head.run("raystream", "list", "--address", "127.0.0.1:1"),
                   "no Ray cluster answers at 127.0.0.1:1")
    not_a_gcs = ray_head.dashboard_url.removeprefix("http://")  # HTTP, not Ray's GCS
    one_line_error(ray_head.run("raystream", "list", "--address", not_a_gcs, timeout=30),
                   f"nothing at {not_a_gcs} answers as a Ray cluster's GCS")
    finished = job_id_from_list(ray_head, "meter-totals", "FINISHED")
    if finished is not None:  # after the first test
        one_line_error(ray_head.run("raystream", "savepoint", finished, str(tmp_path / "sp")),
                       f"job {finished} is FINISHED")
    failing = tmp_path / "failing.py"
    failing.write_text("import raystream as rs\n"
                       "env = rs.StreamEnvironment()\n"
                       "env.from_sequence(10).map(lambda r: r['no_such_column']).collect()\n"
                       "env.execute('failing')\n")
    line = one_line_error(ray_head.run("raystream", "run", str(failing), timeout=180),
                          "job 'failing' failed", "no_such_column", "(at failing.py:4)")
    assert "Traceback" not in line


@pytest.mark.parametrize("token", [None, "not-the-cluster-token"])
def test_token_authentication_stays_on(ray_head, tmp_path, token):
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": None, "RAY_AUTH_TOKEN": token}
    if token is None:  # a client without token authentication
        env = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": None}
    refused = ray_head.run("raystream", "submit", str(EXAMPLES / "meter_totals.py"), "--address",
                           ray_head.dashboard_url, "--", *job_args(tmp_path, 10, None), env=env)
    one_line_error(refused, f"the Ray cluster at {ray_head.dashboard_url} refused this client")
    listed = ray_head.run("raystream", "list", env=env, timeout=60)
    one_line_error(listed, f"the Ray cluster at {ray_head.gcs_address} refused this client")
