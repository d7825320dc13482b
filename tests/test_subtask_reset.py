"""One reader restored alone (a region failover): its splits given after the restored
checkpoint go back to the enumerator, and every split is read exactly once.

The job master's operator coordinators with an in-memory transport (the Ray
transport is exercised by tests/test_region_failover.py). The oracle: every
split the source has, counted by hand, read once over (the reader's state at the
restored checkpoint) + (what it is given after its reset) + (what the other
reader was given).
"""

from __future__ import annotations

import collections
import functools
from typing import Any

from raystream.checkpoint.coordinator_holder import CoordinatedOperator, OperatorCoordinators
from raystream.engine.sources.base import Source
from raystream.engine.sources.files import Files
from raystream.engine.sources.split_enumerator import (NoMoreSplits, ReaderRegistered,
                                                       SourceCoordinator, SplitRequested,
                                                       SplitsAssigned)

OP = "src"


class Instant:
    def done(self) -> bool:
        return True

    def error(self) -> None:
        return None


class Readers:
    """What each reader received, attempt by attempt (a reset starts a new list)."""

    def __init__(self) -> None:
        self.received: dict[int, list[Any]] = collections.defaultdict(list)
        self.ended: set[int] = set()

    def transport(self, operator: str, index: int):
        def send(event: Any) -> Instant:
            if isinstance(event, SplitsAssigned):
                self.received[index].extend(event.splits)
            elif isinstance(event, NoMoreSplits):
                self.ended.add(index)
            return Instant()
        return send


class Letters(Source):
    def splits(self) -> list[Any]:
        return list("abcdef")


def _coordinators(source: Source, parallelism: int = 2) -> OperatorCoordinators:
    coordinators = OperatorCoordinators([CoordinatedOperator(
        OP, parallelism, functools.partial(SourceCoordinator, source=source))])
    coordinators.start()
    return coordinators


def _checkpoint(coordinators: OperatorCoordinators, n: int, *, complete: bool) -> None:
    coordinators.checkpoint(n)
    for index in range(2):
        coordinators.acknowledge([OP], index, n)
    if complete:
        coordinators.complete(n)
    else:
        coordinators.abort(n)


def _reset_and_rebind(coordinators: OperatorCoordinators, readers: Readers, index: int,
                      restored: int) -> list[Any]:
    """Reset reader ``index`` to ``restored``; what its next attempt receives."""
    assert coordinators.support_subtask_reset()
    coordinators.subtask_reset({(OP, index)}, restored)
    readers.received[index], readers.ended = [], readers.ended - {index}
    coordinators.bind(readers.transport, only={(OP, index)})
    coordinators.handle_event_from_subtask(OP, index, ReaderRegistered())
    while index not in readers.ended:
        coordinators.handle_event_from_subtask(OP, index, SplitRequested())
    return readers.received[index]


def test_a_static_reader_registered_after_the_checkpoint_gets_its_splits_again():
    coordinators, readers = _coordinators(Letters()), Readers()
    coordinators.bind(readers.transport)
    coordinators.handle_event_from_subtask(OP, 1, ReaderRegistered())
    _checkpoint(coordinators, 1, complete=True)  # reader 1's splits are in its checkpoint
    coordinators.handle_event_from_subtask(OP, 0, ReaderRegistered())  # after checkpoint 1
    _checkpoint(coordinators, 2, complete=False)
    in_state_at_1 = {0: [], 1: list(readers.received[1])}
    again = _reset_and_rebind(coordinators, readers, 0, restored=1)
    assert again == ["a", "c", "e"]
    read = in_state_at_1[0] + again + readers.received[1]
    assert collections.Counter(read) == collections.Counter("abcdef")
    # reader 1 restored alone to 1: it had all of its splits by then, none come back
    assert _reset_and_rebind(coordinators, readers, 1, restored=1) == []


def test_a_file_reader_gets_back_only_the_files_given_after_the_restored_checkpoint(tmp_path):
    for i in range(6):
        (tmp_path / f"part-{i}.jsonl").write_text(f'{{"x": {i}}}\n')
    coordinators, readers = _coordinators(Files(str(tmp_path), format="jsonl")), Readers()
    coordinators.bind(readers.transport)
    while coordinators.next_due() is None and not _listed(coordinators):
        coordinators.run_due(float("inf"))  # the listing runs on a worker thread
    for index in range(2):
        coordinators.handle_event_from_subtask(OP, index, ReaderRegistered())
        coordinators.handle_event_from_subtask(OP, index, SplitRequested())
    _checkpoint(coordinators, 1, complete=True)
    state_at_1 = list(readers.received[0])
    for index in range(2):
        coordinators.handle_event_from_subtask(OP, index, SplitRequested())
    _checkpoint(coordinators, 2, complete=False)  # taken, then aborted by the failover
    coordinators.handle_event_from_subtask(OP, 0, SplitRequested())
    given_after_1 = readers.received[0][len(state_at_1):]
    assert len(given_after_1) == 2
    again = _reset_and_rebind(coordinators, readers, 0, restored=1)
    assert again[:2] == given_after_1  # first in line, in the order they were given
    coordinators.handle_event_from_subtask(OP, 1, SplitRequested())
    while 1 not in readers.ended:
        coordinators.handle_event_from_subtask(OP, 1, SplitRequested())
    read = state_at_1 + again + readers.received[1]
    assert sorted(str(s) for s in read) == sorted(str(tmp_path / f"part-{i}.jsonl")
                                                   for i in range(6))


def _listed(coordinators: OperatorCoordinators) -> bool:
    enumerator = coordinators.coordinator(OP).enumerator  # type: ignore[attr-defined]
    return bool(enumerator.seen)
