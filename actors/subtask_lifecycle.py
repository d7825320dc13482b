"""A subtask's lifecycle: where it is between taking input and ending (as ``job_status.py``
is a job's), changed only through :func:`advance`, so the table below is every way it
can go.

    >>> advance(Lifecycle.RUNNING, Lifecycle.INPUT_ENDED)
    <Lifecycle.INPUT_ENDED: 'input ended'>
    >>> advance(Lifecycle.FINISHED, Lifecycle.RUNNING)
    Traceback (most recent call last):
    ...
    raystream.actors.subtask_lifecycle.IllegalSubtaskTransition: a subtask cannot go from finished to running

A source held at a stop-with-savepoint's barrier is still RUNNING: it resumes if that
savepoint aborts (the subtask keeps the savepoint's id, not a state of its own).
"""

from __future__ import annotations

import enum


class Lifecycle(enum.Enum):
    RUNNING = "running"  # taking input
    INPUT_ENDED = "input ended"  # every input ended and the chain finished; output on its way
    FINISHED = "finished"  # told the master: only control messages now (final checkpoint, stop)
    STOPPED = "stopped"  # told to stop: the mailbox loop ends
    CANCELED = "canceled"

    @property
    def input_ended(self) -> bool:
        return self in (Lifecycle.INPUT_ENDED, Lifecycle.FINISHED)

    @property
    def ends_loop(self) -> bool:
        return self in (Lifecycle.STOPPED, Lifecycle.CANCELED)


_LEAVE = frozenset({Lifecycle.STOPPED, Lifecycle.CANCELED})
ALLOWED: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.RUNNING: frozenset({Lifecycle.INPUT_ENDED}) | _LEAVE,
    Lifecycle.INPUT_ENDED: frozenset({Lifecycle.FINISHED}) | _LEAVE,
    Lifecycle.FINISHED: _LEAVE,
    # a cancel in the same mails as the stop wins: the subtask reports CANCELED
    Lifecycle.STOPPED: frozenset({Lifecycle.CANCELED}),
    Lifecycle.CANCELED: frozenset(),
}


class IllegalSubtaskTransition(RuntimeError):
    """The subtask tried a change the table does not allow (a bug)."""


def advance(current: Lifecycle, new: Lifecycle) -> Lifecycle:
    """``new``, if a subtask may go there from ``current``."""
    if new not in ALLOWED[current]:
        raise IllegalSubtaskTransition(f"a subtask cannot go from {current.value} to {new.value}")
    return new
