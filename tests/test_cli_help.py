"""``raystream --help`` is complete plain text, and run/submit show how to pass script arguments."""

from __future__ import annotations

import subprocess
import sys


def _help(*args: str) -> str:
    shown = subprocess.run([sys.executable, "-m", "raystream.cli", *args, "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_the_help_is_the_whole_text_without_rst_markup():
    text = _help()
    assert "Errors print as one line; RAYSTREAM_DEBUG=1 shows the traceback." in text
    assert "``" not in text
    assert "\n    raystream run job.py" in text  # the usage table keeps its indentation


def test_run_and_submit_usage_show_script_arguments():
    for command in ("run", "submit"):
        assert "script [-- ARGS ...]" in " ".join(_help(command).split())
