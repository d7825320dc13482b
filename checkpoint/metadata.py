"""What a completed checkpoint's ``_metadata`` says: one type, written and read here.

The coordinator writes a :class:`CheckpointMetadata` when every subtask has
acknowledged (its JSON is the checkpoint's commit point, checksummed by
:mod:`raystream.checkpoint.storage`); a restore, a resume and a savepoint's
reader parse it back with :meth:`CheckpointMetadata.from_json`. The JSON is the
format checkpoints and savepoints have on disk, so old ones still restore:
``watermarks``, ``coordinators``, ``channel_state`` and ``topology`` may be
missing, and the ``committed`` output lists of checkpoints taken before the
collect sink committed through its own commit log (Sink V2) are ignored.

    >>> meta = CheckpointMetadata(job="j", checkpoint_id=3, attempt=0, trigger_ts_ms=1,
    ...                           max_parallelism=128, hash_version=1)
    >>> CheckpointMetadata.from_json(meta.to_json()) == meta
    True
    >>> "channel_state" in meta.to_json()  # only unaligned checkpoints list it
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HandleJson = dict  # a StateHandle as JSON: {"path", "size", "sha256"}


@dataclass(frozen=True)
class OperatorFiles:
    """The state files one operator's subtasks wrote for a checkpoint (handles as JSON)."""

    operator_state: tuple[HandleJson, ...] = ()
    keyed_state: tuple[HandleJson, ...] = ()
    # incremental checkpoints of the disk backend: a manifest's handle with the key
    # groups and the files (shared or private) it references (disk_incremental)
    keyed_db: tuple[HandleJson, ...] = ()


@dataclass(frozen=True)
class RowCounts:
    """Rows read by a job's sources and taken by its data sinks: one subtask's in one
    attempt at its barrier (``SnapshotStats``), or the job's at a checkpoint, over every
    attempt before it (``CheckpointMetadata``), from which a restored attempt counts on.

        >>> RowCounts(read=10, written=4) + RowCounts(read=5, written=1)
        RowCounts(read=15, written=5)
        >>> RowCounts.from_json(RowCounts(3, 2).to_json())
        RowCounts(read=3, written=2)
    """

    read: int = 0
    written: int = 0

    def __add__(self, other: RowCounts) -> RowCounts:
        return RowCounts(self.read + other.read, self.written + other.written)

    def to_json(self) -> dict[str, int]:
        return {"read": self.read, "written": self.written}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RowCounts:
        return cls(int(doc.get("read", 0)), int(doc.get("written", 0)))


@dataclass(frozen=True)
class CheckpointMetadata:
    job: str
    checkpoint_id: int
    attempt: int
    trigger_ts_ms: int
    max_parallelism: int
    hash_version: int
    operators: Mapping[str, OperatorFiles] = field(default_factory=dict)
    # every file the checkpoint needs (a restore verifies them all), in the order written
    handles: tuple[HandleJson, ...] = ()
    # per head operator: WatermarkFloors JSON (an int in older checkpoints)
    watermarks: Mapping[str, Any] = field(default_factory=dict)
    coordinators: Mapping[str, HandleJson] = field(default_factory=dict)  # by operator
    # unaligned checkpoints: in-flight data by channel_state_key, and the plan it fits
    channel_state: Mapping[str, HandleJson] = field(default_factory=dict)
    topology: str | None = None
    rows: RowCounts = RowCounts()  # read and written at the checkpoint, over every attempt
    # the state backend that wrote the keyed state ("heap" or "disk"; None: older ones), so
    # a job of the other backend knows before it deploys what it restores
    state_backend: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``_metadata`` payload (keys are sorted when written: order is free here)."""
        doc: dict[str, Any] = {
            "job": self.job, "checkpoint_id": self.checkpoint_id, "attempt": self.attempt,
            "trigger_ts_ms": self.trigger_ts_ms, "max_parallelism": self.max_parallelism,
            "hash_version": self.hash_version,
            "operators": {name: {"operator_state": list(files.operator_state),
                                 "keyed_state": list(files.keyed_state),
                                 **({"keyed_db": list(files.keyed_db)} if files.keyed_db else {})}
                          for name, files in self.operators.items()},
            "handles": list(self.handles),
            "watermarks": dict(self.watermarks)}
        if self.rows != RowCounts():  # (written by raystream since it counts rows)
            doc["rows"] = self.rows.to_json()
        if self.state_backend is not None:
            doc["state_backend"] = self.state_backend
        if self.coordinators:
            doc["coordinators"] = dict(self.coordinators)
        if self.channel_state:
            doc["channel_state"] = dict(self.channel_state)
            doc["topology"] = self.topology
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CheckpointMetadata:
        """Parse a ``_metadata`` payload; ``ValueError`` if it is not checkpoint metadata."""
        try:
            return cls(
                job=doc.get("job", ""), checkpoint_id=doc["checkpoint_id"],
                attempt=doc.get("attempt", 0), trigger_ts_ms=doc.get("trigger_ts_ms", 0),
                max_parallelism=doc["max_parallelism"], hash_version=doc["hash_version"],
                operators={name: OperatorFiles(tuple(files["operator_state"]),
                                               tuple(files["keyed_state"]),
                                               tuple(files.get("keyed_db", ())))
                           for name, files in doc["operators"].items()},
                handles=tuple(doc.get("handles", ())),
                watermarks=dict(doc.get("watermarks", {})),
                coordinators=dict(doc.get("coordinators", {})),
                channel_state=dict(doc.get("channel_state", {})),
                topology=doc.get("topology"), rows=RowCounts.from_json(doc.get("rows", {})),
                state_backend=doc.get("state_backend"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not checkpoint metadata ({type(exc).__name__}: {exc})") from None
