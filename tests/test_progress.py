"""The progress line: drawn in place on a terminal (a real pty, a real job in a child
process), a line every so often in redirected output; the job's output checked against
numpy."""

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

    storage = sys.argv[1]
    for mode in sys.argv[2:]:  # one job after another, in one Ray
        env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
            storage=storage, interval_s=0.3),
            ray_init_kwargs={"num_cpus": 2, "log_to_driver": False})
        if mode == "bounded":
            sink = env.from_sequence(%d, batch_size=500, num_splits=2).map_batches(slow).collect()
        else:
            sink = env.add_source(Ticks, name="ticks").collect()
        ids = env.execute("progress-" + mode).table(sink)["id"].to_numpy()
        print("RESULT", mode, len(ids), int(ids.sum()), len(np.unique(ids)), flush=True)
""" % N)


LOG_EVERY_S = 0.5  # between the progress lines of redirected output (the default is 5 s)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSTREAM_PROGRESS")}
    env["COLUMNS"] = "150"
    env["RAYSTREAM_PROGRESS_EVERY"] = str(LOG_EVERY_S)
    return env


class _Child:
    """Jobs run one after another in a child process (one Ray start for all)."""

    def __init__(self, script, modes: list[str], storage, on_terminal: bool) -> None:
        self.got = bytearray()
        master = slave = None
        if on_terminal:  # stderr on a pseudo-terminal, read by a thread
            master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, str(script), str(storage), *modes], stdout=subprocess.PIPE,
            stderr=slave if on_terminal else subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=_child_env())
        self.master = master
        self.reader = None
        if master is not None:
            os.close(slave)
            self.reader = threading.Thread(target=self._read)
            self.reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # every writer closed the terminal
                    return
                if not chunk:
                    return
                self.got.extend(chunk)
            elif self.process.poll() is not None:
                return

    def finish(self) -> tuple[str, str]:
        """(stdout, stderr as the terminal or the pipe got it), after the child exited 0."""
        stdout, stderr = self.process.communicate(timeout=240)
        if self.reader is not None:
            self.reader.join(timeout=30)
            os.close(self.master)
            stderr = bytes(self.got)
        err = stderr.decode(errors="replace")
        assert self.process.returncode == 0, err[-3000:]
        return stdout.decode(), err


def _result(stdout: str, mode: str) -> tuple[int, int, int]:
    line = next(line for line in stdout.splitlines() if line.startswith(f"RESULT {mode} "))
    return tuple(int(x) for x in line.split()[2:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A bounded and then an unbounded job on a terminal; a bounded job into a pipe."""
    base = tmp_path_factory.mktemp("progress")
    script = base / "job.py"
    script.write_text(JOB_SCRIPT)
    terminal = _Child(script, ["bounded", "unbounded"], base / "terminal", True).finish()
    redirected = _Child(script, ["bounded"], base / "redirected", False).finish()
    return {"terminal": terminal, "redirected": redirected}


@pytest.mark.slow
def test_bounded_job_draws_a_bar_in_place_on_a_terminal(runs):
    stdout, terminal = runs["terminal"]
    terminal = terminal[:terminal.index("raystream: job progress-unbounded")]  # the first job
    ids = np.arange(N)  # the numpy oracle
    assert _result(stdout, "bounded") == (len(ids), int(ids.sum()), len(np.unique(ids)))
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


@pytest.mark.slow
def test_unbounded_job_shows_rate_and_latest_checkpoint(runs):
    stdout, terminal = runs["terminal"]
    ids = np.concatenate([np.arange(k * 10, k * 10 + 10) for k in range(1, 41)])
    assert _result(stdout, "unbounded") == (len(ids), int(ids.sum()), len(np.unique(ids)))
    draws = [d for d in terminal.split(CLEAR_LINE) if d.startswith("progress-unbounded ")]
    assert draws and all("[" not in d for d in draws)  # no bar: the end is unknown
    assert any(re.search(r"RUNNING \| [\d,]+ rows/s \| [\d,]+ rows \| latest checkpoint #\d+ "
                         r"\(\d+\.\d\d s\)", d) for d in draws), draws


@pytest.mark.slow
def test_redirected_output_gets_the_page_and_a_progress_line_every_so_often(runs):
    stdout, err = runs["redirected"]
    ids = np.arange(N)
    assert _result(stdout, "bounded") == (len(ids), int(ids.sum()), len(np.unique(ids)))
    assert "\r" not in err and "\x1b[" not in err  # nothing drawn in place
    assert re.search(r"^raystream: job progress-bounded-\w+: http://127\.0\.0\.1:\d+/#job=",
                     err, re.M)  # the job's page in the web UI, as on a terminal
    lines = re.findall(r"^raystream: \[ *(\d+) s\] progress-bounded \[[#-]+\] +\d+% "
                       r"([\d,]+)/([\d,]+) rows \| [\d,-]+ rows/s \| checkpoints \d+$", err, re.M)
    assert len(lines) >= 2, err[-2000:]  # a few seconds of a job, a line every 0.5 s
    read = [int(r.replace(",", "")) for _, r, _ in lines]
    assert {int(n.replace(",", "")) for _, _, n in lines} == {N}
    assert read == sorted(read) and read[-1] <= N  # progress never goes back


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
