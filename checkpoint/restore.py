"""What a job restores from: the files of a checkpoint or savepoint, by operator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raystream.checkpoint.handles import IncrementalHandle
from raystream.checkpoint.metadata import RowCounts
from raystream.checkpoint.storage import StateHandle


@dataclass
class OperatorRestore:
    """The state files of one operator in the checkpoint a job restores from (of all the
    subtasks that wrote it)."""

    operator_state: list[StateHandle] = field(default_factory=list)
    keyed_state: list[StateHandle] = field(default_factory=list)
    keyed_db: list[IncrementalHandle] = field(default_factory=list)  # databases, heap chains


@dataclass
class RestoreSpec:
    checkpoint_id: int
    storage_uri: str  # where the handles' files are (checkpoint storage or a savepoint)
    operators: dict[str, OperatorRestore] = field(default_factory=dict)  # operator name -> files
    # per head operator: the watermark its subtasks had reached at the checkpoint, as
    # runs over key groups (WatermarkFloors JSON; an int in older checkpoints)
    watermarks: dict[str, Any] = field(default_factory=dict)
    # channel state of an unaligned checkpoint: channel_state_key(chain, subtask) -> handle
    channel_state: dict[str, StateHandle] = field(default_factory=dict)
    # operator coordinators' states: operator name -> handle
    coordinators: dict[str, StateHandle] = field(default_factory=dict)
    rows: RowCounts = RowCounts()  # read and written when it was taken (the job's progress)
