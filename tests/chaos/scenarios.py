"""Seeded jobs and failures for the exactly-once harness.

A :class:`Scenario` is a job (what it computes, on which keys, into which
sink, under which checkpoint mode) and the failures placed in its run. It is a
frozen dataclass whose ``repr`` is valid Python: a failing seed prints it as
the reproduction, and ``Scenario(...)`` pasted into :func:`run_scenario` (in
``runner.py``) replays it alone.

    >>> generate(7) == generate(7)
    True
"""

from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass, field

from tests.chaos.model import Events


class JobKind(enum.Enum):
    TUMBLING = "tumbling"        # count and sum per (key, 1 s window)
    SLIDING = "sliding"          # count and sum per (key, 1 s window every 0.5 s)
    SESSION = "session"          # count and sum per (key, session with a 300 ms gap)
    REDUCE = "reduce"            # running sums per key over the union of two sources
    PROCESS = "process"          # a KeyedProcessFunction with state and both timer kinds
    # drawn by the later choices (every older seed keeps its job):
    WINDOW_JOIN = "window_join"  # two sources joined per (key, 1 s window), from seed 12000
                                 # on per (key, session) too, pairs counted per (key, 1 s
                                 # window) downstream; no row beyond the bound (with two
                                 # inputs, the join's watermark at a row depends on timing,
                                 # so which late rows drop would not be replayable)
    COUNT_WINDOW = "count_window"  # count and sum per key every 40 rows of it, sliding by 20
    INTERVAL_JOIN = "interval_join"  # two sources joined on rows of a key within 60 ms; no
                                     # row beyond the bound (as for the window join)
    CO_PROCESS = "co_process"    # a KeyedCoProcessFunction over two sources: state shared by
                                 # both inputs, event-time timers; no row beyond the bound
    BROADCAST = "broadcast"      # a KeyedBroadcastProcessFunction: keyed rows weighed at
                                 # event-time timers by the broadcast rules up to that time
    TRIGGERED = "triggered"      # count and sum per (key, 1 s window), fired by a count
                                 # trigger every TRIGGER_COUNT rows of the window (purging
                                 # them, or not: then each firing holds all so far)
    REGIONS = "regions"          # a row-wise map from a source at the job's parallelism into
                                 # the sink: a pipelined region per subtask (region failover)
    SQL_TUMBLE = "sql_tumble"    # count and sum per (key, 1 s window) as a SQL query: TUMBLE
    SQL_HOP = "sql_hop"          # likewise per (key, 1 s window every 0.5 s): HOP
    ASYNC_MAP = "async_map"      # the regions job's map as map_async calls with delays, in
                                 # flight at checkpoints (ordered or not)
    POOL_MAP = "pool_map"        # the regions job's map on a pool of Ray actors per subtask


FIRST_JOBS = [JobKind.TUMBLING, JobKind.SLIDING, JobKind.SESSION, JobKind.REDUCE,
              JobKind.PROCESS]  # what generate() draws first (the others, later)


class Path(enum.Enum):
    """How a window aggregates: pre-aggregated partials (the default), dense per-key
    arrays without pre-aggregation, dense with a late side output, a user
    AggregateFunction (the generic path), or a ProcessWindowFunction given all the
    window's rows (drawn apart, from ``PROCESS_WINDOWS_FROM_SEED`` on)."""

    PRE_AGGREGATED = "pre_aggregated"
    DENSE = "dense"
    LATE_OUTPUT = "late_output"
    GENERIC = "generic"
    PROCESS_WINDOW = "process_window"


FIRST_PATHS = [Path.PRE_AGGREGATED, Path.DENSE, Path.LATE_OUTPUT,
               Path.GENERIC]  # what generate() draws first (the other, later)


class Backend(enum.Enum):
    """Where keyed state lives: the heap (the default) or RocksDB on local disk, with the
    operators' timers. It serves the running sums and the process functions, from seed
    9000 on time windows too (every path: partials, sessions and user functions keep
    their state in RocksDB; from seed 11000 on, process window functions' rows too),
    and from seed 10000 on count windows and joins."""

    HEAP = "heap"
    DISK = "disk"
    DISK_INCREMENTAL = "disk_incremental"  # with incremental checkpoints (shared SST files)


class Sink(enum.Enum):
    COLLECT = "collect"
    PARQUET = "parquet"


class Alignment(enum.Enum):
    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    ALIGNED_TIMEOUT = "aligned_timeout"


class FailureKind(enum.Enum):
    FAILPOINT = "failpoint"          # a named failpoint, armed before the job starts
    SIGKILL = "sigkill"              # SIGKILL of a subtask's process after a checkpoint
    DEPLOY_KILL = "deploy_kill"      # SIGKILL of a subtask's process while deploying
    STOP_AND_RESCALE = "stop"        # stop with a savepoint, restore at another parallelism
    KILL_DURING_STOP = "stop_kill"   # the same, with a SIGKILL of a subtask while it stops
    STORAGE_OUTAGE = "outage"        # checkpoint storage unwritable for a while, then back
    CORRUPT_NEWEST = "corrupt"       # a state file of the newest checkpoint damaged, then a
                                     # SIGKILL: the job must fail naming it (never fall back
                                     # past committed output), or restore a newer one
    MASTER_KILL = "master_kill"      # SIGKILL of the job master's process after a checkpoint:
                                     # Ray restarts it and it takes the job over
    MASTER_KILL_IN_RESTORE = "master_kill_restore"  # the same while the job restores after
                                     # a SIGKILL of a subtask (its first kill)
    MASTER_KILL_IN_STOP = "master_kill_stop"  # the same while the job stops with a savepoint


# Seeds from here on may run the window join or count windows instead of their first
# job; the seeds below (CI's among them, and every seed printed before) keep theirs.
NEW_OPERATORS_FROM_SEED = 1000
# Seeds from here on may keep their state on the disk backend (drawn apart, likewise).
DISK_STATE_FROM_SEED = 2000
DISK_JOBS = (JobKind.REDUCE, JobKind.PROCESS, JobKind.CO_PROCESS, JobKind.BROADCAST)
# Seeds from here on may run their time windows on the disk backend too (drawn apart).
DISK_WINDOWS_FROM_SEED = 9000
DISK_WINDOW_JOBS = (JobKind.TUMBLING, JobKind.SLIDING, JobKind.SESSION)
# Seeds from here on may run count windows and joins on the disk backend too (drawn apart).
DISK_JOINS_FROM_SEED = 10000
DISK_JOIN_JOBS = (JobKind.COUNT_WINDOW, JobKind.WINDOW_JOIN, JobKind.INTERVAL_JOIN,
                  JobKind.TRIGGERED)  # (triggered windows come from later seeds only)
# Seeds from here on may compute their time windows with a ProcessWindowFunction (drawn
# apart; on either backend, as DISK_WINDOW_JOBS holds every time window's path).
PROCESS_WINDOWS_FROM_SEED = 11000
# Seeds from here on may join over session windows (drawn apart; on either backend, as
# DISK_JOIN_JOBS holds the window join).
SESSION_JOINS_FROM_SEED = 12000
# With the right rows 13 ms after their left twins (runner.SESSION_RIGHT_SHIFT_MS): at
# 10 ms half the sessions have one side only, at 30 ms up to 3 rows a side, at 86 ms up to
# 19 a side over up to 861 ms (the same sessions from 78 to 95 ms; from 96 ms on, a key's
# rows make one 20 s session). Hundreds of sessions take rows of two batches at each gap.
SESSION_JOIN_GAPS_MS = (10, 30, 86)
# Seeds from here on may run a window with a count trigger instead (drawn apart; on
# either backend, along any of the window paths but the pre-aggregated one).
TRIGGERS_FROM_SEED = 13000
TRIGGER_COUNT = 2  # a window holds 21 or 22 on-time rows of a key: one within the lateness
                   # makes about half of them fire once more
# Seeds from here on may run the two-input process function instead (drawn apart, likewise),
# and from 6000 on the broadcast one.
CO_PROCESS_FROM_SEED = 5000
BROADCAST_FROM_SEED = 6000
# Seeds from here on may run the embarrassingly parallel job instead (drawn apart), at a
# parallelism of 2 or 3: its failures restart one region where nothing is in doubt.
REGIONS_FROM_SEED = 14000
# Seeds from here on may run the tumbling or sliding windows as a SQL query over a view of
# the source instead (drawn apart; on either backend; no allowed lateness: SQL has none).
SQL_FROM_SEED = 15000
SQL_JOBS = (JobKind.SQL_TUMBLE, JobKind.SQL_HOP)
# Seeds from here on may run the regions job with its map as async calls or on an actor
# pool instead (drawn apart; heap: they keep no keyed state).
IO_MAPS_FROM_SEED = 16000
IO_MAPS = (JobKind.ASYNC_MAP, JobKind.POOL_MAP)
# Seeds from here on may take the disk backend's checkpoints incrementally (drawn apart).
INCREMENTAL_FROM_SEED = 7000
# Seeds from here on may also kill the job master (drawn apart, likewise),
MASTER_KILLS_FROM_SEED = 4000
# and from here on also while the job restores or stops.
MASTER_KILL_MOMENTS_FROM_SEED = 8000

FAILPOINTS = ("in_processing", "in_snapshot", "in_async_write", "right_after_restore")


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    target: str = "keyed"           # "keyed" (the keyed operator's chain) or "source"
    subtask: int = 0
    point: str = ""                 # FAILPOINT: which one
    hit: int = 1                    # FAILPOINT: at which pass (in the next attempt)
    action: str = "exit"            # FAILPOINT: "exit" or "raise"
    after_checkpoints: int = 1      # SIGKILL, STOP_AND_RESCALE: completed checkpoints first
    new_parallelism: int = 3        # STOP_AND_RESCALE, KILL_DURING_STOP
    delay_ms: int = 0               # KILL_DURING_STOP: the kill this long after the request;
                                    # STORAGE_OUTAGE: how long the storage is away

    @property
    def stops(self) -> bool:
        return self.kind in (FailureKind.STOP_AND_RESCALE, FailureKind.KILL_DURING_STOP,
                             FailureKind.MASTER_KILL_IN_STOP)


@dataclass(frozen=True)
class Scenario:
    seed: int
    job: JobKind
    path: Path = Path.PRE_AGGREGATED
    lateness_ms: int = 0
    sink: Sink = Sink.COLLECT
    alignment: Alignment = Alignment.ALIGNED
    parallelism: int = 2
    events: Events = field(default_factory=Events)
    failures: tuple[Failure, ...] = ()
    max_concurrent: int = 1
    backend: Backend = Backend.HEAP
    session_gap_ms: int | None = None  # WINDOW_JOIN: sessions with this gap, not 1 s windows
    trigger_purges: bool = False  # TRIGGERED: the count trigger purges what it fires
    unordered: bool = False  # ASYNC_MAP: results as they come (never across a watermark)

    @property
    def windowed(self) -> bool:
        return self.job in (JobKind.TUMBLING, JobKind.SLIDING, JobKind.SESSION)

    @property
    def two_sources(self) -> bool:
        return self.job in (JobKind.REDUCE, JobKind.WINDOW_JOIN, JobKind.INTERVAL_JOIN,
                            JobKind.CO_PROCESS, JobKind.BROADCAST)

    def describe(self) -> str:
        failures = ", ".join(f.kind.value + (f"({f.point})" if f.point else "")
                             for f in self.failures) or "none"
        return (f"seed {self.seed}: {self.job.value}"
                + (f"/{self.path.value}, lateness {self.lateness_ms}" if self.windowed else "")
                + (f" ({'purging ' if self.trigger_purges else ''}count trigger "
                   f"{TRIGGER_COUNT})/{self.path.value}, lateness {self.lateness_ms}"
                   if self.job is JobKind.TRIGGERED else "")
                + (f" over sessions (gap {self.session_gap_ms} ms)"
                   if self.session_gap_ms is not None else "")
                + (f" ({'un' if self.unordered else ''}ordered)"
                   if self.job is JobKind.ASYNC_MAP else "")
                + f", {'string' if self.events.string_keys else 'int'} keys, "
                f"{self.sink.value}, {self.alignment.value}, p={self.parallelism}, "
                f"{self.backend.value} state, "
                f"max_concurrent={self.max_concurrent}; failures: {failures}")


def generate(seed: int) -> Scenario:
    """A random job and one to three failures, all from ``seed``."""
    rng = random.Random(seed)
    job = rng.choice(FIRST_JOBS)
    path = rng.choice(FIRST_PATHS) if job in (JobKind.TUMBLING, JobKind.SLIDING) else (
        rng.choice([Path.DENSE, Path.LATE_OUTPUT, Path.GENERIC]) if job is JobKind.SESSION
        else Path.DENSE)
    lateness = rng.choice([0, 0, 2500]) if job is not JobKind.REDUCE else 0
    alignment = rng.choice(list(Alignment))
    failures: list[Failure] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice([FailureKind.FAILPOINT, FailureKind.FAILPOINT, FailureKind.SIGKILL,
                           FailureKind.SIGKILL, FailureKind.DEPLOY_KILL,
                           FailureKind.STOP_AND_RESCALE, FailureKind.KILL_DURING_STOP])
        if kind in (FailureKind.STOP_AND_RESCALE, FailureKind.KILL_DURING_STOP) and (
                alignment is not Alignment.ALIGNED or any(f.stops for f in failures)):
            kind = FailureKind.SIGKILL  # unaligned checkpoints restore at one parallelism only
        target = rng.choice(["keyed", "keyed", "source"])
        failures.append(Failure(
            kind, target=target, subtask=rng.randint(0, 1) if target == "keyed" else 0,
            point=rng.choice(FAILPOINTS) if kind is FailureKind.FAILPOINT else "",
            # about a dozen checkpoints and forty batches per run: points that can be reached
            hit=(rng.randint(1, 4) if kind is FailureKind.FAILPOINT else 1),
            action=rng.choice(["exit", "raise"]),
            after_checkpoints=rng.randint(1, 2),
            new_parallelism=rng.choice([1, 3]),
            delay_ms=rng.randint(0, 400) if kind is FailureKind.KILL_DURING_STOP else 0))
    # a restore happens once per attempt: its failpoint can only fire at its first pass
    failures = [dataclasses.replace(f, hit=1) if f.point == "right_after_restore" else f
                for f in failures]
    # a kill while deploying comes first (the runner starts the job with it), once
    failures.sort(key=lambda f: f.kind is not FailureKind.DEPLOY_KILL)
    failures[1:] = [Failure(FailureKind.SIGKILL, f.target, f.subtask)
                    if f.kind is FailureKind.DEPLOY_KILL else f for f in failures[1:]]
    scenario = Scenario(seed=seed, job=job, path=path, lateness_ms=lateness,
                        sink=rng.choice(list(Sink)), alignment=alignment,
                        parallelism=rng.choice([1, 2, 2, 3]),
                        events=Events(string_keys=rng.random() < 0.5),
                        failures=tuple(failures))
    scenario = _with_later_choices(scenario, random.Random(f"{seed}/later"))
    scenario = _with_co_process(scenario, random.Random(f"{seed}/co"))
    scenario = _with_broadcast(scenario, random.Random(f"{seed}/broadcast"))
    scenario = _with_process_window(scenario, random.Random(f"{seed}/process_window"))
    scenario = _with_session_join(scenario, random.Random(f"{seed}/session_join"))
    scenario = _with_trigger(scenario, random.Random(f"{seed}/trigger"))
    scenario = _with_regions(scenario, random.Random(f"{seed}/regions"))
    scenario = _with_sql(scenario, random.Random(f"{seed}/sql"))
    scenario = _with_io_map(scenario, random.Random(f"{seed}/io_map"))
    scenario = _with_backend(scenario, random.Random(f"{seed}/backend"))
    scenario = _with_incremental(scenario, random.Random(f"{seed}/incremental"))
    return _with_master_kill(scenario, random.Random(f"{seed}/master"))


def _with_later_choices(scenario: Scenario, rng: random.Random) -> Scenario:
    """Choices added to the harness later, drawn from a generator of their own so
    that every seed keeps the job and failures it had before them."""
    failures = list(scenario.failures)
    if rng.random() < 0.3:  # one more failure: storage away for a while, or corruption
        kind = rng.choice([FailureKind.STORAGE_OUTAGE, FailureKind.CORRUPT_NEWEST])
        # a deploy kill stays first; a corruption comes last (the job may rightly fail
        # there, and nothing after it could be placed)
        first = int(bool(failures) and failures[0].kind is FailureKind.DEPLOY_KILL)
        at = (len(failures) if kind is FailureKind.CORRUPT_NEWEST
              else rng.randint(first, len(failures)))
        failures.insert(at, Failure(
            kind, subtask=rng.randint(0, 1), after_checkpoints=rng.randint(1, 2),
            delay_ms=rng.randint(200, 1200) if kind is FailureKind.STORAGE_OUTAGE else 0))
    overlapping = rng.choice([1, 1, 2])  # aligned checkpoints only: the others run alone
    scenario = dataclasses.replace(scenario, failures=tuple(failures), max_concurrent=(
        overlapping if scenario.alignment is Alignment.ALIGNED else 1))
    if scenario.seed >= NEW_OPERATORS_FROM_SEED and rng.random() < 0.3:
        # the operators added since: a job of theirs instead
        job = rng.choice([JobKind.WINDOW_JOIN, JobKind.COUNT_WINDOW])
        if job is JobKind.WINDOW_JOIN and rng.random() < 0.5:
            job = JobKind.INTERVAL_JOIN
        scenario = _running(scenario, job, on_time=job in (JobKind.WINDOW_JOIN,
                                                           JobKind.INTERVAL_JOIN))
    return scenario


def _running(scenario: Scenario, job: JobKind, *, on_time: bool) -> Scenario:
    """``scenario`` with ``job`` instead of its first one (dense path, no allowed
    lateness); ``on_time``: no row beyond the watermark bound (a two-input job's
    watermark at a row depends on timing, so which late rows drop is not replayable)."""
    events = scenario.events
    if on_time:
        events = dataclasses.replace(events, late_every=events.n + 1)
    return dataclasses.replace(scenario, job=job, path=Path.DENSE, lateness_ms=0, events=events)


def _with_co_process(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run the two-input process function instead about a third of the time."""
    if scenario.seed < CO_PROCESS_FROM_SEED or rng.random() >= 0.35:
        return scenario
    return _running(scenario, JobKind.CO_PROCESS, on_time=True)


def _with_broadcast(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run the broadcast process function instead about a third of the time."""
    if scenario.seed < BROADCAST_FROM_SEED or rng.random() >= 0.35:
        return scenario
    return _running(scenario, JobKind.BROADCAST, on_time=True)


def _with_process_window(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds compute a time window (as the job finally is) with a
    ProcessWindowFunction about a third of the time, keeping its allowed lateness."""
    if (scenario.seed < PROCESS_WINDOWS_FROM_SEED or not scenario.windowed
            or rng.random() >= 0.35):
        return scenario
    return dataclasses.replace(scenario, path=Path.PROCESS_WINDOW)


def _with_session_join(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds join over session windows (as the job finally is a window join) two
    times in three, with a gap of ``SESSION_JOIN_GAPS_MS``."""
    if (scenario.seed < SESSION_JOINS_FROM_SEED or scenario.job is not JobKind.WINDOW_JOIN
            or rng.random() >= 2 / 3):
        return scenario
    return dataclasses.replace(scenario, session_gap_ms=rng.choice(SESSION_JOIN_GAPS_MS))


def _with_trigger(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run a tumbling window with a count trigger instead about a quarter of
    the time: purging or not, along one of the paths that take a trigger, with or without
    allowed lateness (one reader: the order of a key's rows, which the count follows, is
    the input's)."""
    if scenario.seed < TRIGGERS_FROM_SEED or rng.random() >= 0.25:
        return scenario
    return dataclasses.replace(
        scenario, job=JobKind.TRIGGERED, trigger_purges=rng.random() < 0.5,
        path=rng.choice([Path.DENSE, Path.GENERIC, Path.PROCESS_WINDOW]),
        lateness_ms=rng.choice([0, 2500]), session_gap_ms=None)


def _with_regions(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run the embarrassingly parallel job instead about a quarter of the
    time, at parallelism 2 or 3 (a region per subtask), on the heap (it keeps no keyed
    state)."""
    if scenario.seed < REGIONS_FROM_SEED or rng.random() >= 0.25:
        return scenario
    return dataclasses.replace(scenario, job=JobKind.REGIONS, path=Path.DENSE, lateness_ms=0,
                               parallelism=rng.choice([2, 3]), session_gap_ms=None)


def _with_sql(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run the tumbling or sliding windows as a SQL query instead about a
    fifth of the time (the planner's pre-aggregated window, no allowed lateness), with no
    row beyond the watermark bound: the planner pre-aggregates at the job's parallelism,
    behind a rebalance from the one reader, so the window's watermark at a partial is the
    least of several channels' and depends on timing (as a two-input job's does; after a
    restore, a lagging channel leaves the window judging by the restored floor)."""
    if scenario.seed < SQL_FROM_SEED or rng.random() >= 0.2:
        return scenario
    events = dataclasses.replace(scenario.events, late_every=scenario.events.n + 1)
    return dataclasses.replace(scenario, job=rng.choice(SQL_JOBS), path=Path.PRE_AGGREGATED,
                               lateness_ms=0, events=events, session_gap_ms=None,
                               trigger_purges=False)


def _with_io_map(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds run the regions job's map as async calls (ordered or not) or on an actor
    pool instead about a fifth of the time, at parallelism 1 to 3."""
    if scenario.seed < IO_MAPS_FROM_SEED or rng.random() >= 0.2:
        return scenario
    job = rng.choice(IO_MAPS)
    return dataclasses.replace(scenario, job=job, path=Path.DENSE, lateness_ms=0,
                               parallelism=rng.choice([1, 2, 3]), session_gap_ms=None,
                               trigger_purges=False, backend=Backend.HEAP,
                               unordered=job is JobKind.ASYNC_MAP and rng.random() < 0.5)


def _with_incremental(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds on the disk backend take incremental checkpoints two times in three."""
    if (scenario.seed >= INCREMENTAL_FROM_SEED and scenario.backend is Backend.DISK
            and rng.random() < 2 / 3):
        return dataclasses.replace(scenario, backend=Backend.DISK_INCREMENTAL)
    return scenario


def _with_master_kill(scenario: Scenario, rng: random.Random) -> Scenario:
    """Later seeds kill the job master about half the time, somewhere among the other
    failures: after a deploy kill, before a corruption (which may rightly end the job)."""
    if scenario.seed < MASTER_KILLS_FROM_SEED or rng.random() < 0.5:
        return scenario
    failures = list(scenario.failures)
    first = int(bool(failures) and failures[0].kind is FailureKind.DEPLOY_KILL)
    last = len(failures) - int(bool(failures) and failures[-1].kind is FailureKind.CORRUPT_NEWEST)
    at = rng.randint(first, max(first, last))
    failures.insert(at, Failure(FailureKind.MASTER_KILL, after_checkpoints=rng.randint(1, 2)))
    scenario = dataclasses.replace(scenario, failures=tuple(failures))
    return _with_master_kill_moment(scenario, at, random.Random(f"{scenario.seed}/moment"))


def _with_master_kill_moment(scenario: Scenario, at: int, rng: random.Random) -> Scenario:
    """Later seeds kill the master (failure ``at``) two times in three while the job
    restores or stops instead. A stop needs aligned checkpoints and no other stop."""
    if scenario.seed < MASTER_KILL_MOMENTS_FROM_SEED or rng.random() < 1 / 3:
        return scenario
    kind = rng.choice([FailureKind.MASTER_KILL_IN_RESTORE, FailureKind.MASTER_KILL_IN_STOP])
    if kind is FailureKind.MASTER_KILL_IN_STOP and (
            scenario.alignment is not Alignment.ALIGNED
            or any(f.stops for f in scenario.failures)):
        kind = FailureKind.MASTER_KILL_IN_RESTORE
    failures = list(scenario.failures)
    failures[at] = dataclasses.replace(
        failures[at], kind=kind, target=rng.choice(["keyed", "keyed", "source"]),
        subtask=rng.randint(0, 1), new_parallelism=rng.choice([1, 3]),
        delay_ms=rng.randint(0, 300) if kind is FailureKind.MASTER_KILL_IN_STOP else 0)
    return dataclasses.replace(scenario, failures=tuple(failures))


def _with_backend(scenario: Scenario, rng: random.Random) -> Scenario:
    """Half of the jobs the disk backend serves keep their state there (later seeds only)."""
    jobs = DISK_JOBS + (DISK_WINDOW_JOBS if scenario.seed >= DISK_WINDOWS_FROM_SEED else ())
    if scenario.seed >= DISK_JOINS_FROM_SEED:
        jobs += DISK_JOIN_JOBS + SQL_JOBS
    if scenario.seed >= DISK_STATE_FROM_SEED and scenario.job in jobs and rng.random() < 0.5:
        return dataclasses.replace(scenario, backend=Backend.DISK)
    return scenario
