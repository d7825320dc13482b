"""The file format of one subtask's channel state in an unaligned checkpoint.

One file per subtask and checkpoint (``<chain>-<subtask>.channels``, written
through :meth:`CheckpointStorage.write_state`, so it is checksummed and
listed in the checkpoint's metadata). Its layout is
:func:`~raystream.checkpoint.sections.encode_parts` with

* ``index``: JSON — per channel its id, its direction (``input``: what the
  subtask had received but not processed; ``output``: what it had not sent)
  and its messages in channel order, each ``["data", <part>, <rows>]`` or
  ``["watermark", <ms>]``;
* one part per data batch: an Arrow IPC stream. Never pickle: restoring a
  checkpoint must not execute code from storage.

    >>> import pyarrow as pa
    >>> from raystream.actors.messages import ChannelId, Kind
    >>> ch = ChannelId(1, 0, 1)
    >>> blob = encode_channel_state({ch: [(Kind.DATA, pa.record_batch({"x": [1, 2]}), 2),
    ...                                   (Kind.WATERMARK, 42, 0)]}, {})
    >>> state = decode_channel_state(blob)
    >>> [(e.kind.name, e.rows) for e in state.inputs[ch]], state.outputs
    ([('DATA', 2), ('WATERMARK', 0)], {})
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raystream.actors.messages import REPLAYED_SEQ, ChannelId, Envelope, Kind
from raystream.checkpoint.sections import decode_parts, encode_parts

FORMAT = 1

# (kind, batch or watermark, rows) per message, in channel order
Entries = dict[ChannelId, list[tuple[Kind, Any, int]]]


@dataclass
class ChannelStateContents:
    """A restored subtask's channel state, as messages ready to replay."""

    inputs: dict[ChannelId, list[Envelope]] = field(default_factory=dict)
    outputs: dict[ChannelId, list[Envelope]] = field(default_factory=dict)


def encode_channel_state(inputs: Entries, outputs: Entries) -> bytes:
    parts: dict[str, bytes] = {}
    channels = []
    for direction, entries in (("input", inputs), ("output", outputs)):
        for channel, messages in entries.items():
            if not messages:
                continue
            listed = []
            for kind, value, rows in messages:
                if kind == Kind.DATA:
                    name = f"b{len(parts)}"
                    parts[name] = _ipc(value)
                    listed.append(["data", name, rows])
                elif kind == Kind.WATERMARK:
                    listed.append(["watermark", int(value)])
                else:
                    raise ValueError(f"{kind.name} cannot be channel state")
            channels.append({"edge": channel.edge, "upstream": channel.upstream,
                             "downstream": channel.downstream, "direction": direction,
                             "messages": listed})
    index = json.dumps({"format": FORMAT, "channels": channels}, separators=(",", ":"))
    return encode_parts({"index": index.encode(), **parts})


def decode_channel_state(blob: bytes, attempt: int = 0) -> ChannelStateContents:
    parts = decode_parts(blob)
    index = json.loads(parts["index"])
    if index.get("format") != FORMAT:
        raise ValueError(f"unknown channel state format {index.get('format')!r}")
    contents = ChannelStateContents()
    for entry in index["channels"]:
        channel = ChannelId(entry["edge"], entry["upstream"], entry["downstream"])
        messages = []
        for message in entry["messages"]:
            if message[0] == "data":
                batch = _batch(parts[message[1]])
                messages.append(Envelope(channel, REPLAYED_SEQ, attempt, Kind.DATA, [batch],
                                         batch.num_rows))
            elif message[0] == "watermark":
                messages.append(Envelope(channel, REPLAYED_SEQ, attempt, Kind.WATERMARK,
                                         int(message[1])))
            else:
                raise ValueError(f"unknown channel state message {message[0]!r}")
        side = contents.inputs if entry["direction"] == "input" else contents.outputs
        side[channel] = messages
    return contents


def channel_state_key(vertex_name: str, subtask: int) -> str:
    """How checkpoint metadata names one subtask's channel state."""
    return f"{vertex_name}#{subtask}"


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _batch(data: bytes) -> pa.RecordBatch:
    with pa.ipc.open_stream(data) as reader:
        batches = list(reader)
    if len(batches) != 1:
        raise ValueError(f"a channel state batch holds {len(batches)} batches, expected 1")
    return batches[0]
