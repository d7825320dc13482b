"""A sink's committed output as a checkpoint's metadata lists it, bounded in size.

A collect sink commits one output file per subtask and origin checkpoint, and a
restore must return exactly the files committed up to the checkpoint it goes back
to. Listing all of them in every metadata made each metadata grow with the age of
the job (and the job write quadratically much). Instead the newest handles are
listed inline, and every ``SEGMENT_HANDLES`` of them move into a *segment*: a
write-once JSON file (in the job's output directory, which retention leaves alone)
holding those handles and the handle of the segment before it. The metadata names
only the newest segment; since every handle carries its file's SHA-256, the chain
is verified link by link, like the output files it lists.

>>> out = CommittedOutput()
>>> segments = {}
>>> def write(body):
...     segments[f"s{len(segments)}"] = body
...     return {"path": f"s{len(segments) - 1}"}
>>> for i in range(5):
...     out = out.adding([{"path": f"f{i}"}], write, segment_handles=2)
>>> out.to_json()
{'recent': [{'path': 'f4'}], 'segment': {'path': 's1'}}
>>> [h["path"] for h in out.handles(lambda h: segments[h["path"]])]
['f0', 'f1', 'f2', 'f3', 'f4']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterable

SEGMENT_HANDLES = 256  # handles listed inline before they move into a segment file

HandleJson = dict  # a StateHandle as JSON: {"path", "size", "sha256"}


@dataclass(frozen=True)
class CommittedOutput:
    """One sink's committed output files: ``recent`` inline, older ones in a chain of
    segments ending at ``segment`` (None: there are none yet)."""

    recent: tuple[HandleJson, ...] = ()
    segment: HandleJson | None = None

    @classmethod
    def from_json(cls, value: object) -> CommittedOutput:
        """Read a metadata entry; a plain list (metadata written before segments
        existed) lists every handle inline."""
        if isinstance(value, list):
            return cls(tuple(value))
        if (isinstance(value, dict) and isinstance(value.get("recent"), list)
                and (value.get("segment") is None or isinstance(value["segment"], dict))):
            return cls(tuple(value["recent"]), value.get("segment"))
        raise ValueError(f"not a committed output entry: {value!r:.200}")

    def to_json(self) -> dict:
        return {"recent": list(self.recent), "segment": self.segment}

    def adding(self, handles: Iterable[HandleJson],
               write_segment: Callable[[bytes], HandleJson], *,
               segment_handles: int | None = None) -> CommittedOutput:
        """With ``handles`` committed too; ``write_segment(body)`` publishes a new
        segment file once (write-once: a new name every time) and returns its handle."""
        recent = self.recent + tuple(handles)
        if len(recent) < (segment_handles or SEGMENT_HANDLES):
            return CommittedOutput(recent, self.segment)
        body = json.dumps({"previous": self.segment, "handles": list(recent)}).encode()
        return CommittedOutput((), write_segment(body))

    def handles(self, read_segment: Callable[[HandleJson], bytes]) -> list[HandleJson]:
        """Every committed handle, oldest first. ``read_segment(handle)`` returns a
        segment's bytes after verifying them against its handle."""
        chunks = [list(self.recent)]
        segment = self.segment
        while segment is not None:
            body = json.loads(read_segment(segment))
            chunks.append(body["handles"])
            segment = body["previous"]
        return [handle for chunk in reversed(chunks) for handle in chunk]
