"""Which splits went to which reader since which checkpoint (Flink ``SplitAssignmentTracker``).

A source coordinator hands splits out through the subtask gateways, so a split
assigned before the coordinator's snapshot of checkpoint ``n`` is in reader
state of ``n``, and one assigned after it is not (it is in neither the
enumerator's nor the reader's checkpoint ``n``). When one reader alone is
restored to checkpoint ``k`` (a region failover), the splits it was given
after the coordinator's snapshot of ``k`` go back to the enumerator
(``SplitEnumerator.add_splits_back``); the others stay where they are.

    >>> tracker = SplitAssignmentTracker()
    >>> tracker.assigned(0, ["a"])
    >>> tracker.checkpointed(1)          # "a" is in reader 0's checkpoint 1
    >>> tracker.assigned(0, ["b"]); tracker.assigned(1, ["c"])
    >>> tracker.checkpointed(2)          # taken, then aborted: never completes
    >>> tracker.assigned(0, ["d"])
    >>> tracker.take_back(0, restored=1)
    ['b', 'd']
    >>> tracker.take_back(0, restored=1), tracker.take_back(1, restored=1)
    ([], ['c'])
"""

from __future__ import annotations

from typing import Any


class SplitAssignmentTracker:
    def __init__(self) -> None:
        # checkpoint id -> reader -> the splits assigned before that coordinator snapshot
        # (and after the one before it)
        self._by_checkpoint: dict[int, dict[int, list[Any]]] = {}
        self._since_last: dict[int, list[Any]] = {}  # not in any coordinator snapshot yet

    def assigned(self, subtask: int, splits: list[Any]) -> None:
        self._since_last.setdefault(subtask, []).extend(splits)

    def checkpointed(self, checkpoint_id: int) -> None:
        """The coordinator's snapshot of ``checkpoint_id`` was taken."""
        if self._since_last:
            self._by_checkpoint[checkpoint_id] = self._since_last
            self._since_last = {}

    def completed(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` completed: what was assigned before it is checkpointed for good."""
        for n in [n for n in self._by_checkpoint if n <= checkpoint_id]:
            del self._by_checkpoint[n]

    def take_back(self, subtask: int, restored: int | None) -> list[Any]:
        """The splits ``subtask`` was given after the coordinator's snapshot of ``restored``
        (None: ever), in the order they were given, forgotten here."""
        back: list[Any] = []
        for n in sorted(self._by_checkpoint):
            if restored is None or n > restored:
                back.extend(self._by_checkpoint[n].pop(subtask, []))
        back.extend(self._since_last.pop(subtask, []))
        return back
