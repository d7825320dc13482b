"""Run a script and mark each line of its output by who wrote it, to tell raystream's and
the script's own lines from everything else (Ray's, Spark's, librdkafka's).

    python -m tests.support.own_lines SCRIPT [ARGS...]

A line is *own* when Python code of the script itself (``print`` in it) or of raystream's
packages (its progress lines, the web UI's address) wrote it through ``sys.stdout`` or
``sys.stderr``: such a line starts with ``EXAMPLE| `` or ``RAYSTREAM| ``. Everything else
is unmarked: what a library's Python code writes (Ray's driver printing raylet messages,
``warnings``, ``logging``'s handlers, a traceback), and what any native code or child
process writes to file descriptors 1 and 2 (librdkafka, Ray's C++ core, Spark's JVM).
Who wrote is the file of the Python frame that called ``write``: ``print`` is no Python
frame, so for a ``print`` that is the caller of ``print``.
"""

from __future__ import annotations

import os
import runpy
import sys
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import TextIO

ROOT = Path(__file__).resolve().parents[2]
# raystream's packages (pyproject's package-dir: they install as raystream.<name>)
PACKAGES = tuple(str(ROOT / name) + os.sep for name in
                 ("raystream", "engine", "core", "actors", "checkpoint", "timers", "spark"))


class Writer(Enum):
    EXAMPLE = "EXAMPLE| "
    RAYSTREAM = "RAYSTREAM| "
    OTHER = ""


def writer_of(frame: FrameType, script: str) -> Writer:
    """Who wrote, by the frame that called ``write``. A DataFrame's ``show()`` prints the
    table the script asked for: the script's line."""
    filename = frame.f_code.co_filename
    if filename == script or (frame.f_code.co_name == "show"
                              and filename.endswith(os.path.join("pyspark", "sql",
                                                                 "dataframe.py"))):
        return Writer.EXAMPLE
    if filename.startswith(PACKAGES):
        return Writer.RAYSTREAM
    return Writer.OTHER


class MarkedStream:
    """A text stream that puts the writer's mark at the start of each line and writes whole
    lines, each at once (so a native write to the same descriptor falls between lines)."""

    def __init__(self, stream: TextIO, script: str) -> None:
        self._stream, self._script = stream, script
        self._partial = ""  # the line begun, with its mark

    def write(self, text: str) -> int:
        mark = writer_of(sys._getframe(1), self._script).value
        lines = []
        for piece in text.splitlines(keepends=True):
            line = (self._partial or mark) + piece
            if piece.endswith(("\n", "\r")):
                lines.append(line)
                self._partial = ""
            else:
                self._partial = line
        for line in lines:
            self._stream.write(line)
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._stream.write(self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def main() -> None:
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(script))
    sys.stdout = MarkedStream(sys.stdout, script)  # type: ignore[assignment]
    sys.stderr = MarkedStream(sys.stderr, script)  # type: ignore[assignment]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
