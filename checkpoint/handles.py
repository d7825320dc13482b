"""What a subtask's snapshot of one operator wrote, typed from the subtask that wrote it
to the coordinator, and from the metadata back to the subtask that restores it.

A subtask acknowledges a checkpoint with an :class:`OperatorSubtaskState` per operator
of its chain (Flink's ``OperatorSubtaskState``): the handle of its operator state file,
of its keyed state file, and of an incremental snapshot of its keyed state
(:class:`IncrementalHandle`: a RocksDB database's manifest, or the heap backend's chain
of changes, in the format its own module writes). JSON is written only where the
checkpoint's metadata file is (:meth:`OperatorSubtaskState.to_json`), and parsed where it
is read back (:meth:`IncrementalHandle.from_json`).

    >>> handle = StateHandle("/c/job/chk-1/sum-0.op", 12, "0" * 64)
    >>> state = OperatorSubtaskState(operator_state=handle)
    >>> state.to_json()["operator_state"]["size"], state.uploaded
    (12, 12)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from raystream.checkpoint.storage import StateHandle

CHAIN_FORMAT = "heap-chain"  # the heap backend's chains of changes (heap_changelog)


def is_heap_chain(handle: Mapping[str, Any]) -> bool:
    """Is this keyed-state handle of an incremental checkpoint the heap backend's?"""
    return handle.get("format") == CHAIN_FORMAT


@dataclass(frozen=True)
class IncrementalHandle:
    """An incremental snapshot of one subtask's keyed state: its own file (the
    manifest, or the chain's newest file) and every file it references, the key groups
    it covers and the bytes this checkpoint uploaded; ``doc`` is the JSON its module
    (:mod:`~raystream.checkpoint.disk_incremental`, :mod:`~raystream.checkpoint.
    heap_changelog`) wrote and reads back.

        >>> doc = {"path": "/c/m", "size": 3, "sha256": "0" * 64, "key_groups": [0, 64],
        ...        "files": [{"path": "/c/shared/1-a.sst", "size": 9, "sha256": "1" * 64}],
        ...        "uploaded": 12}
        >>> handle = IncrementalHandle.from_json(doc)
        >>> handle.key_groups, handle.uploaded, handle.is_heap_chain, handle.files[0].size
        (range(0, 64), 12, False, 9)
    """

    doc: Mapping[str, Any]
    files: tuple[StateHandle, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files",
                           tuple(StateHandle.from_json(f) for f in self.doc.get("files", ())))

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> IncrementalHandle:
        if "key_groups" not in doc:
            raise ValueError(f"not an incremental state handle (no key groups): {doc!r}")
        return cls(dict(doc))

    def to_json(self) -> dict[str, Any]:
        return dict(self.doc)

    @property
    def key_groups(self) -> range:
        start, stop = self.doc["key_groups"]
        return range(start, stop)

    @property
    def uploaded(self) -> int:
        """Bytes this checkpoint wrote (files of earlier ones are referenced again)."""
        return int(self.doc.get("uploaded", self.doc.get("size", 0)))

    @property
    def is_heap_chain(self) -> bool:
        return is_heap_chain(self.doc)


@dataclass(frozen=True)
class OperatorSubtaskState:
    """The files one operator's snapshot wrote in one subtask."""

    operator_state: StateHandle | None = None
    keyed_state: StateHandle | None = None
    keyed_db: IncrementalHandle | None = None

    @property
    def uploaded(self) -> int:
        """Bytes written for this checkpoint."""
        return sum(h.size for h in (self.operator_state, self.keyed_state) if h is not None) + (
            self.keyed_db.uploaded if self.keyed_db is not None else 0)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.operator_state is not None:
            doc["operator_state"] = self.operator_state.to_json()
        if self.keyed_state is not None:
            doc["keyed_state"] = self.keyed_state.to_json()
        if self.keyed_db is not None:
            doc["keyed_db"] = self.keyed_db.to_json()
        return doc
