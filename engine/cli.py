"""The ``raystream`` command: run job scripts, submit them to a Ray cluster, manage their jobs.

    raystream run job.py [--detach] [--resume | --restore-from PATH] [-- ARGS]
                                                          run a job script in this process
    raystream submit job.py --address http://HEAD:8265 [--wait] [-- ARGS]
                                                          run it on a cluster (Ray Jobs API)
    raystream list                                        the cluster's jobs
    raystream status JOB | checkpoints JOB | metrics JOB  one job: summary, checkpoints, metrics
    raystream cancel JOB                                  cancel a running job
    raystream savepoint JOB PATH                          savepoint a running job (it keeps running)
    raystream stop JOB --savepoint PATH [--drain]         savepoint it and stop it
    raystream ui [--host 127.0.0.1] [--port 8290]         the web UI of the cluster's jobs
    raystream sql -f job.sql | -e "INSERT ..."            run a SQL script as a job

A job script builds a job and runs it with ``env.execute(...)``, like
``examples/meter_totals.py``. ``raystream run`` runs it with Ray in this
process, or on the cluster named by ``RAY_ADDRESS``; on a terminal it draws
each job's progress on one line of stderr, elsewhere it prints a progress line
every few seconds, and it prints the address of the job's page in the web UI.
``raystream submit`` uploads the script's directory and runs
``raystream run`` on the cluster's head through the Ray Jobs API.

The job commands connect to the Ray cluster at ``--address`` (default:
``RAY_ADDRESS``, else the raystream cluster running on this machine: a Ray
that has run raystream, never another Ray found here; without one they say
so in a line, within seconds): run them on the head node (``ray exec
cluster.yaml 'raystream list'``) or on another node of the cluster. Their
output may go into a pipe that closes early (``| head``): they then exit 141
without a word. ``JOB`` is a job id, a unique prefix of one, or a job
name (the newest job of that name). With token authentication on, set
``RAY_AUTH_MODE=token`` and the cluster's token (``~/.ray/auth_token`` or
``RAY_AUTH_TOKEN_PATH``), as for any Ray client (for a Ray found on this machine
an unset ``RAY_AUTH_MODE`` with a token at hand is token mode, as for ``ray.init()``).

Errors print as one line; ``RAYSTREAM_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import runpy
import shlex
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from raystream.engine import sql_command

PROG = "raystream"
TERMINAL_SUBMISSION_STATUSES = {"SUCCEEDED", "FAILED", "STOPPED"}
PIPE_CLOSED_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a tool a closed pipe ended


# -- run ---------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from raystream.engine.environment import run_defaults
    from raystream.core.logs import set_verbose

    if args.verbose:
        set_verbose()
    script = Path(args.script)
    if not script.is_file():
        raise FileNotFoundError(f"no job script {script}")
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.resolve().parent))  # as `python job.py` does
    if args.resume and args.restore_from:
        raise ValueError("--resume and --restore-from both name where to start: pass one")
    # env.execute shows the progress: in place on a terminal, else a line every so often
    with run_defaults(restore_from=args.restore_from, progress_every=args.progress_every,
                      resume=args.resume, detach=args.detach, progress_to=sys.stdout):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


# -- ui ----------------------------------------------------------------------------------------------
def cmd_ui(args: argparse.Namespace) -> int:
    from raystream.engine.ui import server

    if not server.is_loopback(args.host):
        server.create_app(require_token=True)  # refuses at once where the token is off
    connect(args.address)
    server.serve(args.host, args.port, on_start=lambda url: print(
        f"raystream ui: serving {url} (Ctrl-C stops)", flush=True))
    return 0


# -- submit (Ray Jobs API) -----------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    from ray.job_submission import JobSubmissionClient

    script = Path(args.script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no job script {args.script}")
    working_dir = Path(args.working_dir).resolve() if args.working_dir else script.parent
    if not script.is_relative_to(working_dir):
        raise ValueError(f"{script} is not inside the working directory {working_dir}")
    entrypoint = ["raystream", "run", str(script.relative_to(working_dir)),
                  "--progress-every", str(args.progress_every)]
    if args.restore_from:
        entrypoint += ["--restore-from", args.restore_from]
    if args.resume:
        entrypoint += ["--resume"]
    if args.args:
        entrypoint += ["--", *args.args]
    address = _jobs_api_address(args.address)
    where = address or "the default address"
    with _captured_stderr(), _refusal_explained(where):
        client = JobSubmissionClient(address)
        submission = client.submit_job(
            entrypoint=shlex.join(entrypoint), submission_id=args.submission_id,
            runtime_env={"working_dir": str(working_dir),
                         "excludes": [".venv", ".git", "__pycache__", "*.parquet"]})
    print(f"submitted {submission}: {shlex.join(entrypoint)}", flush=True)
    if not args.wait:
        print(f"follow it with: ray job logs --follow {submission}  or  raystream list")
        return 0
    status = follow_submission(client, submission)
    if status != "SUCCEEDED":
        info = client.get_job_info(submission)
        message = (info.message or "").strip().splitlines()
        raise RuntimeError(f"submission {submission} {status}" +
                           (f": {message[-1]}" if message else ""))
    print(f"submission {submission} SUCCEEDED")
    return 0


def _jobs_api_address(address: str | None) -> str | None:
    """Where to submit: ``--address``, else what ``RAY_API_SERVER_ADDRESS`` or
    ``RAY_ADDRESS`` name (None: Ray reads them), else the Jobs API of raystream's
    cluster on this machine (never Ray's guess at any Ray running here)."""
    if address or os.environ.get("RAY_API_SERVER_ADDRESS") or _address_in_environment():
        return address
    from raystream.engine.cluster_discovery import (PROBE_TIMEOUT_S, dashboard_url,
                                                    find_raystream_cluster, within)

    with _captured_stderr():
        gcs = find_raystream_cluster()
        url = within(PROBE_TIMEOUT_S, lambda: dashboard_url(gcs))
    if url is None:
        raise ConnectionError(f"the raystream cluster at {gcs} serves no Jobs API (its Ray runs "
                              f"without a dashboard, as an embedded Ray does): run the script "
                              f"here with raystream run, or submit to a cluster's dashboard "
                              f"with --address http://HEAD:8265")
    return url


def follow_submission(client: Any, submission: str, poll_s: float = 1.0) -> str:
    """Print the submission's log as it grows until it ends; return its final status."""
    printed = 0
    while True:
        status = str(client.get_job_status(submission).value)
        logs = client.get_job_logs(submission)
        if len(logs) > printed:
            sys.stdout.write(logs[printed:])
            sys.stdout.flush()
            printed = len(logs)
        if status in TERMINAL_SUBMISSION_STATUSES:
            return status
        time.sleep(poll_s)


# -- job commands ------------------------------------------------------------------------------------
def connect(address: str | None) -> None:
    """Connect to the Ray cluster (never start one): ``address``, else ``RAY_ADDRESS``,
    else raystream's own cluster on this machine (:mod:`raystream.engine.cluster_discovery`:
    found within seconds, never an unrelated Ray)."""
    import ray

    if ray.is_initialized():
        return
    named = address or _address_in_environment()
    if named is None:
        from raystream.engine.cluster_discovery import find_raystream_cluster

        with _captured_stderr():  # Ray's C++ warnings about the Rays that refused or hung
            named = find_raystream_cluster()
    _join(named)


def _address_in_environment() -> str | None:
    """``RAY_ADDRESS`` when it names a cluster ("auto" and "local" name none)."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    return None if address in ("", "auto", "local") else address


def _join(address: str) -> None:
    import ray

    # Fail within seconds when the cluster is not there or refuses the token (Ray would
    # retry for 20 s), and say why in one line instead of Ray's log of every attempt.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "5")
    _check_reachable(address)
    from raystream.core.ray_start import is_loopback_address, loopback_node

    if is_loopback_address(address):
        loopback_node()  # or Ray looks for 127.0.0.1's cluster at this machine's external IP
    if "://" not in address:
        _check_a_node_here(address)
    with _captured_stderr() as captured:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except Exception as exc:
            reasons = [line.split("Unauthenticated: ", 1)[1].strip()
                       for line in captured.read().splitlines() if "Unauthenticated: " in line]
            if reasons:
                raise ConnectionError(_refused(address, reasons[-1])) from None
            raise ConnectionError(f"cannot connect to the Ray cluster at {address}: "
                                  f"{str(exc).splitlines()[0]}") from None


def _check_a_node_here(address: str) -> None:
    """A driver joins through a raylet on its own machine: from elsewhere Ray would look
    for one for a minute, so say at once where to run the command instead."""
    from raystream.engine.cluster_discovery import (PROBE_TIMEOUT_S, cluster_node_ids,
                                                    is_a_node_here, local_raylets, within)
    from ray.exceptions import AuthenticationError

    with _captured_stderr(), _refusal_explained(address):
        try:
            nodes = within(PROBE_TIMEOUT_S, lambda: cluster_node_ids(address))
        except AuthenticationError:
            raise
        except TimeoutError:
            raise ConnectionError(f"nothing at {address} answers as a Ray cluster's GCS within "
                                  f"{PROBE_TIMEOUT_S:.0f} s: give the GCS address (port 6379 "
                                  f"unless ray start --port said otherwise)") from None
        except Exception:
            return  # ray.init says what is wrong
    if nodes and not is_a_node_here(nodes, local_raylets()):
        raise ConnectionError(f"this machine is not a node of the Ray cluster at {address}: run "
                              f"the command on one of its nodes, e.g. on the head: "
                              f"ray exec cluster.yaml 'raystream ...'")


@contextlib.contextmanager
def _refusal_explained(address: str) -> Iterator[None]:
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        raise ConnectionError(_refused(address, str(exc).split(". ")[0])) from None


def _refused(address: str, reason: str) -> str:
    return (f"the Ray cluster at {address} refused this client: {reason} (set RAY_AUTH_MODE=token "
            f"and the cluster's token: ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)")


def _check_reachable(address: str) -> None:
    """A ``host:port`` address must accept a TCP connection (Ray would keep retrying for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray://...: Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster answers at {address}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _captured_stderr() -> Iterator[Any]:
    """Everything written to file descriptor 2 (also by Ray's C++ core) goes to a temp file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield _Rewound(capture)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


class _Rewound:
    def __init__(self, file: Any) -> None:
        self.file = file

    def read(self) -> str:
        self.file.flush()
        self.file.seek(0)
        return self.file.read()


def cmd_list(args: argparse.Namespace) -> int:
    from raystream.engine import registry
    from raystream.engine.live_jobs import live_masters, status_of

    connect(args.address)
    jobs = registry.all_jobs()
    live = live_masters()
    if args.json:
        return _print_json([{**job, "status": status_of(job, live)} for job in jobs])
    if not jobs:
        print("no raystream jobs on this Ray cluster")
        return 0
    rows = [[job["job_id"], job["name"], status_of(job, live), str(job["attempt"]),
             str(sum(c["status"] == "COMPLETED" for c in job["checkpoints"])),
             _when(job["started_at"]), _duration(job)] for job in jobs]
    _table(["JOB ID", "NAME", "STATUS", "RESTARTS", "CHECKPOINTS", "STARTED", "DURATION"], rows)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from raystream.engine import registry
    from raystream.engine.job_progress import progress_lines
    from raystream.engine.live_jobs import live_masters, metrics_of, progress_of, status_of

    connect(args.address)
    job = registry.find_job(args.job)
    live = live_masters()
    progress = progress_of(job, live)
    if args.json:
        return _print_json({**job, "status": status_of(job, live), "metrics": metrics_of(job, live),
                            "progress": progress})
    checkpoints = job["checkpoints"]
    completed = [c for c in checkpoints if c["status"] == "COMPLETED"]
    lines = [("job", f"{job['job_id']} ({job['name']})"),
             ("status", status_of(job, live)),
             ("restarts", str(job["attempt"])),
             ("started", f"{_when(job['started_at'])} ({_duration(job)})"),
             ("checkpoints", f"{len(completed)} completed of {len(checkpoints)}"
                             + (f", latest #{completed[-1]['checkpoint_id']}" if completed else ""))]
    lines += progress_lines(progress)
    if job.get("submission_id"):
        lines.append(("submission", job["submission_id"]))
    placement = dict(job.get("placement") or {})
    if placement:
        per_node: dict[str, int] = {}
        for node in placement.values():
            per_node[node] = per_node.get(node, 0) + 1
        lines.append(("nodes", ", ".join(f"{node[:12]} ({count} subtasks)"
                                         for node, count in sorted(per_node.items()))))
    if job.get("error"):
        lines.append(("error", job["error"].splitlines()[0]))
    for failure in job["failures"]:
        lines.append(("failure", failure.splitlines()[0]))
    if job.get("restores"):
        from raystream.engine.recovery import describe
        lines.append(("last recovery", describe(job["restores"][-1])))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    print("plan")
    for line in job["plan"].splitlines():
        print(f"  {line}")
    metrics = metrics_of(job, live)
    if metrics:
        print("metrics")
        _print_metrics(metrics, indent="  ")
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from raystream.engine import registry

    connect(args.address)
    job = registry.find_job(args.job)
    if args.json:
        return _print_json(job["checkpoints"])
    if not job["checkpoints"]:
        print(f"job {job['job_id']} has taken no checkpoints")
        return 0
    rows = []
    from raystream.checkpoint.snapshot_stats import PHASES

    # where the time went (the longest of any subtask, as Flink's checkpoint details):
    # trigger to first barrier, waiting for barriers, synchronous and asynchronous part
    for c in job["checkpoints"]:
        note = c.get("savepoint") or c.get("reason") or ""
        rows.append([str(c["checkpoint_id"]), c["status"], _when(c["trigger_ts_ms"] / 1000),
                     f"{c['duration_s']:.3f} s", _bytes(c["size"]),
                     *(f"{c[p]:.3f} s" if c.get(p) is not None else "-" for p in PHASES),
                     note])
    _table(["ID", "STATUS", "TRIGGERED", "DURATION", "SIZE", "START DELAY", "ALIGNMENT", "SYNC",
            "ASYNC", "SAVEPOINT / REASON"], rows)
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from raystream.engine import registry
    from raystream.engine.live_jobs import live_masters, metrics_of

    connect(args.address)
    job = registry.find_job(args.job)
    metrics = metrics_of(job, live_masters())
    if args.json:
        return _print_json(metrics)
    if not metrics:
        print(f"job {job['job_id']}: no metrics (yet)")
        return 0
    _print_metrics(metrics)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    client = _attach(args)
    client.cancel()
    print(f"job {client.job_id}: {client.wait(timeout_s=args.timeout).status}")
    return 0


def cmd_savepoint(args: argparse.Namespace) -> int:
    client = _attach(args)
    path = client.savepoint(args.path, timeout_s=args.timeout)
    print(f"job {client.job_id}: savepoint written to {path}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = _attach(args)
    result = client.stop_with_savepoint(args.savepoint, drain=args.drain, timeout_s=args.timeout)
    print(f"job {client.job_id}: {result.status}, savepoint written to {args.savepoint}")
    return 0


def _attach(args: argparse.Namespace) -> Any:
    from raystream.engine.client import JobClient

    connect(args.address)
    return JobClient.attach(args.job)


METRIC_COLUMNS = [("records_in", "RECORDS IN", "{:,.0f}"), ("records_out", "RECORDS OUT", "{:,.0f}"),
                  ("bytes_in", "BYTES IN", None), ("bytes_out", "BYTES OUT", None),
                  ("batches_in", "BATCHES IN", "{:,.0f}"), ("batches_out", "BATCHES OUT", "{:,.0f}"),
                  ("backpressure", "BACKPRESSURE", "{:.0%}"),
                  ("watermark_lag_ms", "WATERMARK LAG", "{:,.0f} ms"),
                  ("checkpoint_duration_s", "LAST CHECKPOINT", "{:.3f} s"),
                  ("checkpoint_alignment_s", "ALIGNMENT", "{:.3f} s"),
                  ("checkpoint_size", "STATE", None)]


def _print_metrics(metrics: dict[str, dict[str, float]], indent: str = "") -> None:
    rows = []
    for subtask in sorted(metrics):
        m = metrics[subtask]
        row = [subtask]
        for key, _, fmt in METRIC_COLUMNS:
            value = m.get(key)
            row.append("-" if value is None else (_bytes(value) if fmt is None else fmt.format(value)))
        rows.append(row)
    _table(["SUBTASK"] + [title for _, title, _ in METRIC_COLUMNS], rows, indent=indent)


# -- formatting --------------------------------------------------------------------------------------
def _print_json(value: Any) -> int:
    print(json.dumps(value, indent=1, default=str))
    return 0


def _table(header: list[str], rows: list[list[str]], indent: str = "") -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(indent + "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def _when(epoch_s: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s)) if epoch_s else "-"


def _duration(job: dict) -> str:
    end = job.get("ended_at") or time.time()
    return f"{end - job['started_at']:.1f} s" + ("" if job.get("ended_at") else " so far")


# -- entry point -------------------------------------------------------------------------------------
def _help_epilog() -> str:
    """The module docstring after its first line, as plain text (no RST backticks)."""
    # (__doc__ is None under python -OO)
    return "\n".join((__doc__ or "").splitlines()[2:]).replace("``", "").strip("\n")


def build_parser() -> argparse.ArgumentParser:
    summary = (__doc__ or "\n").splitlines()[0]  # (__doc__ is None under python -OO)
    parser = argparse.ArgumentParser(prog=PROG, description=summary.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=_help_epilog())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run a job script here (Ray in this process, or RAY_ADDRESS)",
                              usage=f"{PROG} run [-h] [--detach] [--resume | --restore-from PATH] "
                                    f"[--progress-every SECONDS] [--verbose] script [-- ARGS ...]")
    run.add_argument("script", help="the job script; arguments after -- go to it (sys.argv)")
    run.add_argument("--detach", action="store_true",
                     help="the script's jobs keep running if this process exits, is killed or "
                          "loses the cluster (watch them with raystream list/status)")
    run.add_argument("--resume", action="store_true",
                     help="start each job from the newest checkpoint a run of the same name "
                          "left in its checkpoint storage (from the beginning if none)")
    run.add_argument("--restore-from", metavar="PATH",
                     help="start the script's jobs from this savepoint or retained checkpoint")
    run.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                     help="print each running job's progress this often where the output "
                          "is not a terminal (0: never; a terminal's line is redrawn in place)")
    run.add_argument("--verbose", action="store_true",
                     help="show Ray's and Spark's own log lines too (RAYSTREAM_LOG=debug)")
    run.set_defaults(handler=cmd_run)

    submit = commands.add_parser("submit", help="run a job script on a Ray cluster (Ray Jobs API)",
                                 usage=f"{PROG} submit [-h] [--address URL] [--resume | --restore-from PATH] "
                                       f"[--working-dir DIR] [--submission-id ID] "
                                       f"[--progress-every SECONDS] [--wait] script [-- ARGS ...]")
    submit.add_argument("script", help="the job script; arguments after -- go to it (sys.argv)")
    submit.add_argument("--address", metavar="URL",
                        help="the cluster's dashboard, e.g. http://127.0.0.1:8265 (default: "
                             "RAY_API_SERVER_ADDRESS or RAY_ADDRESS, else the dashboard of the "
                             "raystream cluster on this machine)")
    submit.add_argument("--restore-from", metavar="PATH",
                        help="as for run: start the script's jobs from this savepoint or "
                             "retained checkpoint (a path the cluster's nodes read)")
    submit.add_argument("--resume", action="store_true",
                        help="as for run: start from the newest checkpoint of the same job name")
    submit.add_argument("--working-dir", metavar="DIR",
                        help="directory to upload (default: the script's)")
    submit.add_argument("--submission-id", metavar="ID",
                        help="the Ray Jobs API's id for the submission (default: one Ray makes)")
    submit.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                        help="print each running job's progress into the submission's log "
                             "this often (0: never)")
    submit.add_argument("--wait", action="store_true",
                        help="follow the job's output until it ends; fail if it fails")
    submit.set_defaults(handler=cmd_submit)
    sql_command.add_parser(commands)

    def job_command(name: str, handler: Callable, help_text: str, *, job: bool = True,
                    timeout: bool = False, as_json: bool = False) -> argparse.ArgumentParser:
        command = commands.add_parser(name, help=help_text)
        if job:
            command.add_argument("job", metavar="JOB", help="job id, unique id prefix, or name")
        command.add_argument("--address", metavar="HOST:PORT",
                             help="the Ray cluster's GCS address (default: RAY_ADDRESS, else "
                                  "the raystream cluster on this machine, never another Ray)")
        if as_json:
            command.add_argument("--json", action="store_true", help="print JSON, for scripts")
        if timeout:
            command.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                                 help="how long to wait for the job (default 300)")
        command.set_defaults(handler=handler)
        return command

    job_command("list", cmd_list, "the cluster's raystream jobs", job=False, as_json=True)
    job_command("status", cmd_status, "a job's status, plan and metrics", as_json=True)
    job_command("checkpoints", cmd_checkpoints, "a job's checkpoint history", as_json=True)
    job_command("metrics", cmd_metrics, "a job's metrics per subtask", as_json=True)
    job_command("cancel", cmd_cancel, "cancel a running job", timeout=True)
    savepoint = job_command("savepoint", cmd_savepoint, "savepoint a running job", timeout=True)
    savepoint.add_argument("path", metavar="PATH", help="directory or URI for the savepoint")
    stop = job_command("stop", cmd_stop, "savepoint a running job and stop it", timeout=True)
    stop.add_argument("--savepoint", required=True, metavar="PATH",
                      help="directory or URI for the savepoint the job stops with")
    stop.add_argument("--drain", action="store_true",
                      help="end the input first, so every window fires")
    ui = job_command("ui", cmd_ui, "serve the web UI of the cluster's jobs", job=False)
    ui.add_argument("--host", default="127.0.0.1",
                    help="address to serve on (default 127.0.0.1; any other requires Ray's "
                         "token: RAY_AUTH_MODE=token)")
    ui.add_argument("--port", type=int, default=8290, help="port to serve on (default 8290)")
    return parser


def one_line(exc: BaseException, script: str | None = None) -> str:
    """An error as one readable line: the message's first line, and where in the script."""
    from raystream.engine.errors import RaystreamError

    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    text = message if isinstance(exc, RaystreamError) else f"{type(exc).__name__}: {message}"
    if script is not None:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if Path(f.filename).resolve() == Path(script).resolve()]
        if frames:
            text += f" (at {Path(script).name}:{frames[-1].lineno})"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``; return the exit status (141 when stdout's pipe closed)."""
    try:
        code = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, so that a closed pipe is seen here and not at exit
        return code
    except BrokenPipeError:
        return _pipe_closed()


def _run(argv: list[str]) -> int:
    script_args: list[str] = []
    if "--" in argv:  # what follows goes to the job script
        argv, script_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error (argparse printed it)
        sys.stdout.flush()
        return exit_.code if isinstance(exit_.code, int) else 2
    args.args = script_args
    try:
        return args.handler(args)
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("RAYSTREAM_DEBUG"):
            raise
        script = args.script if args.command == "run" else None
        print(f"{PROG} {args.command}: error: {one_line(exc, script)}", file=sys.stderr)
        _last_word_on_stderr()
        return 1


def _last_word_on_stderr() -> None:
    """The error line stays the last line: what Ray's threads still log while the
    process exits (a GCS client giving up on a server that never answered) is dropped."""
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _pipe_closed() -> int:
    """The reader of stdout left (``raystream checkpoints JOB | head -1``): end quietly.

    Exit 141 (128 + SIGPIPE), as ``cat``, ``ls`` or ``seq`` do when a pipe closes (a
    pipeline's status stays ``head``'s unless ``set -o pipefail`` asks for every part),
    so a script can tell cut output from a complete one. Not by restoring SIGPIPE's
    default action instead: a write to a closed socket of Ray's would then kill the
    process. Python flushes stdout once more at exit: it goes to /dev/null.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return PIPE_CLOSED_EXIT


if __name__ == "__main__":
    sys.exit(main())
