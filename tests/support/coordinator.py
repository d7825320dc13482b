"""A CheckpointCoordinator built by hand, without Ray: a real ``CheckpointConfig`` and
real checkpoint files under a test's directory, and a :class:`Recorder` of what its
callbacks (the Ray calls to the subtasks) receive."""

from __future__ import annotations

from pathlib import Path

from raystream.checkpoint.barrier import Barrier
from raystream.checkpoint.config import CheckpointConfig
from raystream.checkpoint.coordinator import CheckpointCoordinator
from raystream.checkpoint.handles import IncrementalHandle, OperatorSubtaskState
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.checkpoint.storage import CheckpointStorage, StateHandle
from raystream.core.failpoints import Failpoints

JOB = "job-1"
SUBTASKS = [(0, 0), (0, 1), (1, 0)]
NEVER = 1e6  # a timeout no test reaches


class Recorder:
    """The coordinator's three callbacks; records what they receive.

    ``notify_complete`` also reads the checkpoint's metadata through its own
    ``CheckpointStorage`` at the moment it is called, to check that the
    checkpoint was durable before anyone was told.
    """

    def __init__(self, root: str) -> None:
        self.storage = CheckpointStorage(root)
        self.barriers: list[Barrier] = []
        self.completed: list[int] = []
        self.aborted: list[int] = []
        self.metadata_at_notify: dict[int, object] = {}

    def send_trigger(self, barrier: Barrier) -> None:
        self.barriers.append(barrier)

    def notify_complete(self, n: int) -> None:
        try:
            self.metadata_at_notify[n] = self.storage.read_metadata(JOB, n)
        except Exception as exc:  # recorded; the test asserts on it
            self.metadata_at_notify[n] = exc
        self.completed.append(n)

    def notify_aborted(self, n: int) -> None:
        self.aborted.append(n)

    @property
    def triggered(self) -> list[int]:
        return [b.checkpoint_id for b in self.barriers]


def make(tmp_path: Path, *, subtasks=SUBTASKS, failpoints=(), **config
         ) -> tuple[CheckpointCoordinator, Recorder]:
    """A coordinator of job ``JOB`` over ``subtasks``, checkpoints into ``tmp_path`` with
    ``config`` (no timeout unless given), and the recorder of its callbacks."""
    config.setdefault("timeout_s", NEVER)
    rec = Recorder(str(tmp_path))
    coord = CheckpointCoordinator(
        config=CheckpointConfig(storage=str(tmp_path), **config),
        job_key=JOB, job_name="test job", subtasks=subtasks, max_parallelism=128,
        send_trigger=rec.send_trigger, notify_complete=rec.notify_complete,
        notify_aborted=rec.notify_aborted,
        failpoints=Failpoints(tuple(failpoints), "coordinator", None, 0))
    return coord, rec


def subtask_state(*, operator_state: dict | None = None, keyed_state: dict | None = None,
                  keyed_db: dict | None = None) -> OperatorSubtaskState:
    """One operator's acknowledged files, from their handles' JSON."""
    return OperatorSubtaskState(
        None if operator_state is None else StateHandle.from_json(operator_state),
        None if keyed_state is None else StateHandle.from_json(keyed_state),
        None if keyed_db is None else IncrementalHandle.from_json(keyed_db))


def ack_all(coord: CheckpointCoordinator, n: int, written: dict | None = None,
            attempt: int | None = None) -> None:
    """Acknowledge ``n`` from every subtask; ``written`` maps subtask -> its written dict."""
    written = written or {}
    for subtask in coord.subtasks:
        coord.acknowledge(coord.attempt if attempt is None else attempt, n, subtask,
                          written.get(subtask, {}), SnapshotStats(size=0))
