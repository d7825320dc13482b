"""Why a running job has not finished: the answer of ``JobClient.diagnosis()``.

It names the subtasks that have not reported *finished* (each with what it
still waits for: :class:`~raystream.actors.liveness.SubtaskLiveness`), the
checkpoints in progress with the subtasks they wait for, and whether the
final checkpoint (FLIP-147) has been taken. A test's deadline and the failure
harness print it when a job overruns.

>>> print(JobDiagnosis("chaos-64", "RUNNING", 3, unfinished=(NoAnswer("sum[0]", "no answer in 2 s"),),
...                    pending_checkpoints=(), final_checkpoint=None, newest_completed=1400))
job chaos-64: RUNNING, attempt 3, newest completed checkpoint 1400, no final checkpoint yet
  not finished: sum[0]: no answer in 2 s
"""

from __future__ import annotations

from dataclasses import dataclass

from raystream.actors.liveness import NoAnswer, SubtaskLiveness


@dataclass(frozen=True)
class PendingCheckpointView:
    checkpoint_id: int
    age_s: float
    waiting_for: tuple[str, ...]  # "chain[index]" of the subtasks that have not acknowledged

    def describe(self) -> str:
        waiting = ", ".join(self.waiting_for) or "nothing (its metadata is being written)"
        return f"checkpoint {self.checkpoint_id} pending for {self.age_s:.1f} s, waiting for {waiting}"


@dataclass(frozen=True)
class JobDiagnosis:
    job_name: str
    status: str
    attempt: int
    unfinished: tuple[SubtaskLiveness | NoAnswer, ...]  # the subtasks not finished
    pending_checkpoints: tuple[PendingCheckpointView, ...]
    final_checkpoint: int | None  # the end-of-input checkpoint, once triggered
    newest_completed: int | None

    @property
    def input_read(self) -> bool:
        """The attempt runs, and every source of it has read all its input (each subtask
        not finished said so): from here the job ends with its final checkpoint.

        >>> JobDiagnosis("j", "RUNNING", 0, (), (), None, 3).input_read
        True
        """
        return self.status == "RUNNING" and all(
            isinstance(s, SubtaskLiveness) and not s.reading for s in self.unfinished)

    def __str__(self) -> str:
        final = ("no final checkpoint yet" if self.final_checkpoint is None
                 else f"final checkpoint {self.final_checkpoint}")
        lines = [f"job {self.job_name}: {self.status}, attempt {self.attempt}, "
                 f"newest completed checkpoint {self.newest_completed}, {final}"]
        lines += [f"  not finished: {s.describe()}" for s in self.unfinished]
        lines += [f"  {p.describe()}" for p in self.pending_checkpoints]
        return "\n".join(lines)
