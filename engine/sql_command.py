"""``raystream sql``: run a SQL script as a job, as Flink's SQL client does.

    raystream sql -f job.sql [--name NAME] [--parallelism N]
                  [--checkpoint-storage URI [--checkpoint-interval SECONDS]]
                  [--detach] [--resume | --restore-from PATH]
    raystream sql -e "CREATE TABLE ...; INSERT INTO ..."

The script's DDL defines tables, views and functions; its INSERT statements (and
statement sets) become one job, which runs here (or on ``RAY_ADDRESS``'s cluster) and
is managed as any job (``raystream status``, ``savepoint``, ``stop``; ``--resume``,
``--restore-from``). When it ends, the rows of its ``collect`` tables are printed. An
``EXPLAIN`` prints its plan; a script without an INSERT runs nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "raystream"


def add_parser(commands: argparse._SubParsersAction) -> None:
    sql = commands.add_parser(
        "sql", help="run a SQL script as a job (DDL, then its INSERTs as one job)",
        usage=f"{PROG} sql [-h] (-f FILE | -e TEXT) [--name NAME] [--parallelism N] "
              f"[--checkpoint-storage URI] [--checkpoint-interval SECONDS] [--detach] "
              f"[--resume | --restore-from PATH] [--progress-every SECONDS]")
    given = sql.add_mutually_exclusive_group(required=True)
    given.add_argument("-f", "--file", metavar="FILE", help="the SQL script to run")
    given.add_argument("-e", "--execute", metavar="TEXT", help="the SQL statements to run")
    sql.add_argument("--name", default=None,
                     help="the job's name (default: the script's file name, else 'sql')")
    sql.add_argument("--parallelism", type=int, default=1, metavar="N",
                     help="subtasks of each operator (default 1)")
    sql.add_argument("--checkpoint-storage", metavar="URI",
                     help="checkpoint into this directory or pyarrow.fs URI (exactly-once "
                          "sinks, restarts after a failure); without it: no checkpoints")
    sql.add_argument("--checkpoint-interval", type=float, default=1.0, metavar="SECONDS",
                     help="how often to checkpoint (default 1)")
    sql.add_argument("--detach", action="store_true",
                     help="submit the job and return: it runs on without this process")
    sql.add_argument("--resume", action="store_true",
                     help="start from the newest checkpoint a run of the same name left")
    sql.add_argument("--restore-from", metavar="PATH",
                     help="start from this savepoint or retained checkpoint")
    sql.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                     help="print the job's progress this often where the output is not a "
                          "terminal (0: never)")
    sql.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from raystream.checkpoint.config import CheckpointConfig
    from raystream.engine.environment import StreamEnvironment, run_defaults

    if args.file:
        script = Path(args.file)
        if not script.is_file():
            raise FileNotFoundError(f"no SQL script {script}")
        text, name = script.read_text(), args.name or script.stem
    else:
        text, name = args.execute, args.name or "sql"
    if args.resume and args.restore_from:
        raise ValueError("--resume and --restore-from both name where to start: pass one")
    checkpoints = None if args.checkpoint_storage is None else CheckpointConfig(
        interval_s=args.checkpoint_interval, storage=args.checkpoint_storage)
    env = StreamEnvironment(parallelism=args.parallelism, checkpoints=checkpoints)
    statements = env.sql(text)
    if not statements.sinks:
        return 0
    if args.detach:
        client = env.execute_async(name, restore_from=args.restore_from, resume=args.resume,
                                   detach=True)
        print(f"{PROG} sql: job {client.job_id} submitted (raystream status {client.job_id})")
        return 0
    with run_defaults(progress_every=args.progress_every, progress_to=sys.stdout):
        result = env.execute(name, restore_from=args.restore_from, resume=args.resume)
    for table in statements.collected:
        rows = result.table(statements[table])
        print(f"{table}: {rows.num_rows} rows")
        if rows.num_rows:
            print(rows.to_pandas().to_string(max_rows=50, index=False))
    return 0
