"""What a job restores from: the files of a checkpoint or savepoint, by operator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OperatorRestore:
    """The state files of one operator in the checkpoint a job restores from."""

    operator_state: list[dict] = field(default_factory=list)  # StateHandle JSON, all old subtasks
    keyed_state: list[dict] = field(default_factory=list)
    keyed_db: list[dict] = field(default_factory=list)  # incremental disk-state handles


@dataclass
class RestoreSpec:
    checkpoint_id: int
    storage_uri: str  # where the handles' files are (checkpoint storage or a savepoint)
    operators: dict[str, OperatorRestore] = field(default_factory=dict)  # operator name -> files
    # per head operator: the watermark its subtasks had reached at the checkpoint, as
    # runs over key groups (WatermarkFloors JSON; an int in older checkpoints)
    watermarks: dict[str, Any] = field(default_factory=dict)
    # channel state of an unaligned checkpoint: channel_state_key(chain, subtask) -> handle
    channel_state: dict[str, dict] = field(default_factory=dict)
    # operator coordinators' states: operator name -> handle
    coordinators: dict[str, dict] = field(default_factory=dict)
