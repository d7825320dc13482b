"""What a running subtask still waits for before it can end.

A job ends once every subtask has reported *finished* and the final checkpoint
is committed (FLIP-147). When a job does not end, the question is which subtask
has not reported, and what it waits for: a source reader for splits or the
enumerator's no-more-splits, any other subtask for the end of input on some of
its channels. :meth:`SubtaskActor.liveness <raystream.actors.subtask_actor.SubtaskActor.liveness>`
answers with a :class:`SubtaskLiveness`, read on the subtask's control lane (it
never waits behind data), and the job master gathers them for the subtasks that
have not finished (``JobClient.diagnosis``).

>>> stuck = SubtaskLiveness("sum", 0, attempt=2, inputs_ended=False, finished_reported=False,
...                         waiting_for=(), channels=(ChannelProgress("0:1->0", False, -1),))
>>> print(stuck.describe())
sum[0] (attempt 2): inputs open; channel 0:1->0 open (no end of input yet, watermark -1)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChannelProgress:
    """An input channel that has not ended yet."""

    channel: str  # "edge:upstream->downstream"
    end_of_input_arrived: bool  # arrived, not yet consumed (data or a barrier before it)
    watermark: int

    def describe(self) -> str:
        state = ("end of input arrived, not consumed" if self.end_of_input_arrived
                 else "no end of input yet")
        return f"channel {self.channel} open ({state}, watermark {self.watermark})"


@dataclass(frozen=True)
class NoAnswer:
    """A subtask asked for its :class:`SubtaskLiveness` that could not say."""

    subtask: str  # "chain[index]"
    reason: str  # not deployed in this attempt, no answer in time, or the error

    def describe(self) -> str:
        return f"{self.subtask}: {self.reason}"


@dataclass(frozen=True)
class SubtaskLiveness:
    """Where one subtask stands on its way to the end of its input."""

    operator: str  # the chain's name
    index: int
    attempt: int
    inputs_ended: bool  # every input ended: the chain has finished
    finished_reported: bool  # ... and the job master was told
    waiting_for: tuple[str, ...]  # the operators' own words (a source reader's splits)
    channels: tuple[ChannelProgress, ...]  # the input channels still open
    source: bool = False  # its chain starts with a source

    @property
    def reading(self) -> bool:
        """A source with input left to read (or splits it may still be given)."""
        return self.source and not self.inputs_ended

    @property
    def subtask(self) -> str:
        return f"{self.operator}[{self.index}]"

    def describe(self) -> str:
        if self.finished_reported:
            stage = "finished (reported)"
        elif self.inputs_ended:
            stage = "inputs ended, output not all sent"
        else:
            stage = "inputs open"
        parts = [stage, *self.waiting_for, *(c.describe() for c in self.channels)]
        return f"{self.subtask} (attempt {self.attempt}): " + "; ".join(parts)
