"""``raystream --help`` is complete plain text, run/submit show how to pass script arguments,
and every subcommand and option has help text."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from raystream.engine.cli import build_parser


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


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """Every option, positional argument and subcommand under ``parser`` without help text."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            documented = {choice.dest: choice.help for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                if not (documented.get(name) or "").strip():
                    missing.append(f"{path} {name} (the subcommand)")
                missing += _undocumented(subparser, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_subcommand_and_option_has_help_text():
    parser = build_parser()
    assert not _undocumented(parser, "raystream"), "no help= for:\n" + "\n".join(
        _undocumented(parser, "raystream"))


def test_the_check_finds_an_option_without_help():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands.choices["list"].add_argument("--undocumented")
    commands.add_parser("hidden")
    assert _undocumented(parser, "raystream") == ["raystream list --undocumented",
                                                  "raystream hidden (the subcommand)"]


def test_every_job_command_says_how_a_cluster_is_found():
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction))
    for command in ("list", "status", "checkpoints", "metrics", "cancel", "savepoint", "stop", "ui"):
        assert "RAY_ADDRESS" in commands.choices[command].format_help(), command


def test_help_into_a_closed_pipe_is_quiet():
    read, write = os.pipe()
    os.close(read)  # `raystream --help | head -0`: the reader left before a byte was written
    try:
        shown = subprocess.run([sys.executable, "-m", "raystream.cli", "--help"], stdout=write,
                               stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert shown.returncode in (0, 141) and not shown.stderr, (shown.returncode, shown.stderr)
