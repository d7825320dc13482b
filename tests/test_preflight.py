"""A job that cannot start as configured fails before Ray starts, in one line naming what
is wrong: a path read_files reads, the checkpoint storage, what it restores from.

Each case runs in a fresh interpreter (this suite's own Ray is up already), which also
says whether Ray was started.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import raystream as rs
from raystream.engine.preflight import runs_here

CASE = textwrap.dedent("""
    import sys, ray, raystream as rs
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=1.0, storage=sys.argv[2]) if sys.argv[2] else None)
    if sys.argv[1] == "files":
        env.read_files(sys.argv[3], format="csv").collect()
    else:
        env.from_sequence(10).collect()
    try:
        env.execute("preflight", restore_from=sys.argv[4] or None)
    except rs.JobSetupError as exc:
        print("SETUP", exc)
    print("RAY", ray.is_initialized())
""")


def run_case(tmp_path, kind: str, *, storage: str = "", path: str = "",
             restore_from: str = "") -> list[str]:
    script = tmp_path / "case.py"
    script.write_text(CASE)
    ran = subprocess.run([sys.executable, str(script), kind, storage, path, restore_from],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.splitlines()


@pytest.mark.timeout(300)
def test_what_keeps_a_job_from_starting_is_named_before_ray_starts(tmp_path):
    missing = tmp_path / "no-such-dir"
    blocked = tmp_path / "a-file"
    blocked.write_text("where the checkpoint directory should be")
    empty = tmp_path / "not-a-savepoint"
    empty.mkdir()
    storage = str(tmp_path / "checkpoints")
    assert run_case(tmp_path, "files", path=str(missing)) == [
        f"SETUP read_files('{missing}'): {missing} does not exist", "RAY False"]
    lines = run_case(tmp_path, "sequence", storage=str(blocked / "checkpoints"))
    assert lines[0].startswith(f"SETUP CheckpointConfig(storage='{blocked}/checkpoints'): "
                               f"checkpoint storage {blocked}/checkpoints is not writable")
    assert "NotADirectoryError" in lines[0] and lines[1:] == ["RAY False"]
    lines = run_case(tmp_path, "sequence", storage=storage, restore_from=str(empty))
    assert lines == [f"SETUP restore_from='{empty}': no complete savepoint or checkpoint there "
                     f"(a savepoint's directory, or a job's checkpoint directory holding "
                     f"chk-<n> directories)", "RAY False"]


def test_a_job_on_a_cluster_leaves_the_checks_to_its_master():
    assert runs_here(None, environ={}) and runs_here("local", environ={})
    assert runs_here(None, environ={"RAY_ADDRESS": "127.0.0.1:6379"})
    assert not runs_here(None, environ={"RAY_ADDRESS": "10.1.2.3:6379"})
    assert not runs_here("ray://head:10001", environ={})
    # a Ray this process joined already decides: the embedded one is on loopback
    assert runs_here(None, environ={}, connected_gcs="127.0.0.1:6379")
    assert not runs_here(None, environ={}, connected_gcs="10.1.2.3:6379")
    assert not runs_here(None, environ={}, connected_gcs="")


def test_a_setup_error_is_a_value_error_of_raystream():
    assert issubclass(rs.JobSetupError, rs.RaystreamError)
    assert issubclass(rs.JobSetupError, ValueError)
