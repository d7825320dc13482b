"""The progress line: drawn in place on a terminal (a real pty, a real job in a child
process), absent from redirected output; the job's output checked against numpy."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pyarrow as pa
import pytest

from raystream.engine.progress import CLEAR_LINE, Extent, Snapshot, input_extent, render

N = 30_000  # rows; 60 batches of 500, each held 0.05 s by the map: a few seconds of progress

JOB_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import pyarrow as pa
    import raystream as rs

    class Ticks(rs.SourceOperator):  # a source of its own: its extent is unknown
        def open(self):
            self.left = 40
        def emit_next(self):
            if self.left == 0:
                return False
            time.sleep(0.1)
            self.output.emit(pa.record_batch({"id": np.arange(self.left * 10, self.left * 10 + 10)}))
            self.left -= 1
            return True

    def slow(batch):
        time.sleep(0.05)
        return batch

    mode, storage = sys.argv[1], sys.argv[2]
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        storage=storage, interval_s=0.3), ray_init_kwargs={"num_cpus": 2, "log_to_driver": False})
    if mode == "bounded":
        sink = env.from_sequence(%d, batch_size=500, num_splits=2).map_batches(slow).collect()
    else:
        sink = env.add_source(Ticks, name="ticks").collect()
    ids = env.execute("progress-" + mode).table(sink)["id"].to_numpy()
    print("RESULT", len(ids), int(ids.sum()), len(np.unique(ids)), flush=True)
""" % N)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSTREAM_PROGRESS")}
    env["COLUMNS"] = "150"
    return env


def _run_on_pty(script, mode: str, storage) -> tuple[str, str]:
    """Run the job with stderr on a pseudo-terminal; (stdout, what the terminal got)."""
    master, slave = pty.openpty()
    child = subprocess.Popen([sys.executable, str(script), mode, str(storage)],
                             stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                             env=_child_env())
    os.close(slave)
    got = bytearray()

    def read() -> None:
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # every writer closed the terminal
                    return
                if not chunk:
                    return
                got.extend(chunk)
            elif child.poll() is not None:
                return

    reader = threading.Thread(target=read)
    reader.start()
    stdout, _ = child.communicate(timeout=240)
    reader.join(timeout=30)
    os.close(master)
    assert child.returncode == 0, got.decode(errors="replace")[-3000:]
    return stdout.decode(), got.decode(errors="replace")


def _result(stdout: str) -> tuple[int, int, int]:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return tuple(int(x) for x in line.split()[1:])


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "job.py"
    path.write_text(JOB_SCRIPT)
    return path


def test_bounded_job_draws_a_bar_in_place_on_a_terminal(script, tmp_path):
    stdout, terminal = _run_on_pty(script, "bounded", tmp_path / "ckpt")
    ids = np.arange(N)
    assert _result(stdout) == (len(ids), int(ids.sum()), len(np.unique(ids)))  # numpy oracle
    assert re.search(r"raystream: job progress-bounded-\w+: http://127\.0\.0\.1:\d+/#job=",
                     terminal)  # the job's page in the web UI, above the line
    draws = [d for d in terminal.split(CLEAR_LINE) if d.startswith("progress-bounded [")]
    assert draws, terminal[-2000:]
    assert all("\n" not in d for d in draws), "the progress line must be redrawn in place"
    counts = [tuple(map(lambda s: int(s.replace(",", "")), m.groups()))
              for m in (re.search(r"(\d[\d,]*)/(\d[\d,]*) rows", d) for d in draws)]
    assert {total for _, total in counts} == {N}  # rows known: the sequence's size
    read = [r for r, _ in counts]
    assert read == sorted(read) and read[-1] <= N  # progress never goes back
    assert len(set(read)) >= 2, "the bar was drawn once, not updated"
    assert all(re.search(r"\d+% .* rows/s \| checkpoints \d+", d) for d in draws)
    assert terminal.rfind(CLEAR_LINE) > terminal.rfind("progress-bounded ["), \
        "the line is cleared when the job ends"


def test_unbounded_job_shows_rate_and_latest_checkpoint(script, tmp_path):
    stdout, terminal = _run_on_pty(script, "unbounded", tmp_path / "ckpt")
    ids = np.concatenate([np.arange(k * 10, k * 10 + 10) for k in range(1, 41)])
    assert _result(stdout) == (len(ids), int(ids.sum()), len(np.unique(ids)))
    draws = [d for d in terminal.split(CLEAR_LINE) if d.startswith("progress-unbounded ")]
    assert draws and all("[" not in d for d in draws)  # no bar: the end is unknown
    assert any(re.search(r"RUNNING \| [\d,]+ rows/s \| [\d,]+ rows \| latest checkpoint #\d+ "
                         r"\(\d+\.\d\d s\)", d) for d in draws), draws


def test_redirected_output_has_no_progress(script, tmp_path):
    child = subprocess.run([sys.executable, str(script), "bounded", str(tmp_path / "ckpt")],
                           capture_output=True, env=_child_env(), timeout=240)
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    ids = np.arange(N)
    assert _result(child.stdout.decode()) == (len(ids), int(ids.sum()), len(np.unique(ids)))
    err = child.stderr.decode(errors="replace")
    assert "\r" not in err and "rows/s" not in err and "\x1b[" not in err
    assert "http://" not in err  # the job's page is announced on a terminal only


def test_render_never_wraps_and_says_status_while_restarting():
    snapshot = Snapshot("a-job-with-a-long-name" * 5, "RESTARTING", 10, None, 0, None, 2)
    line = render(snapshot, Extent(True, 100), width=60)
    assert len(line) == 59
    line = render(Snapshot("j", "RESTARTING", 10, None, 0, None, 2), Extent(True, 100), 200)
    assert "RESTARTING" in line and "restarts 2" in line and "- rows/s" in line


def test_extent_of_sources(tmp_path):
    import raystream as rs

    env = rs.StreamEnvironment()
    env.from_sequence(10).collect()
    env.from_collection([{"a": 1}, {"a": 2}]).collect()
    env.from_arrow(pa.table({"x": list(range(7))})).collect()
    assert input_extent(env.transformations) == Extent(True, 19)
    env.read_files(str(tmp_path)).collect()  # bounded, size unknown before reading
    assert input_extent(env.transformations) == Extent(True, None)
    env.read_files(str(tmp_path), monitor_interval_s=1.0).collect()  # continuous
    assert input_extent(env.transformations) == Extent(False, None)
