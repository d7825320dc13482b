"""CheckpointMetadata (checkpoint/metadata.py) keeps the on-disk ``_metadata`` format.

The payloads below are written out by hand in the format checkpoints and savepoints
have on disk (the one the coordinator wrote as a plain dict before the type existed);
parsing and writing them again must give the same checksummed bytes, and older
payloads (no watermarks, committed collect output listed in the metadata, which is
ignored now that the collect sink keeps its own commit log) must still restore.
"""

from __future__ import annotations

import copy

import pytest

from raystream.checkpoint.coordinator import restore_spec_of
from raystream.checkpoint.metadata import CheckpointMetadata, OperatorFiles
from raystream.checkpoint.storage import (METADATA_FORMAT, CheckpointStorage, StateHandle,
                                          checksummed_json)


def handle(name: str, size: int = 10) -> dict:
    return {"path": f"/ckpt/job/chk-4/{name}", "size": size, "sha256": "ab" * 32}


ALIGNED = {
    "job": "orders", "checkpoint_id": 4, "attempt": 1, "trigger_ts_ms": 1700000000123,
    "max_parallelism": 128, "hash_version": 1,
    "operators": {"sum": {"operator_state": [handle("sum-0.op")],
                          "keyed_state": [handle("sum-0.kg"), handle("sum-1.kg")]},
                  "numbers": {"operator_state": [handle("numbers-0.op")], "keyed_state": []}},
    "handles": [handle("sum-0.op"), handle("sum-0.kg"), handle("sum-1.kg"),
                handle("numbers-0.op"), handle("coordinator-0.state")],
    "watermarks": {"numbers": [[0, 127, 5000]]},
    "coordinators": {"numbers": handle("coordinator-0.state")},
}
UNALIGNED = {**copy.deepcopy(ALIGNED),
             "channel_state": {"a#0": handle("a-0.channels"), "a#1": handle("a-1.channels")},
             "topology": "numbers -> sum"}
UNALIGNED["handles"] += [handle("a-0.channels"), handle("a-1.channels")]


@pytest.mark.parametrize("payload", [ALIGNED, UNALIGNED], ids=["aligned", "unaligned"])
def test_parsed_and_written_again_byte_for_byte(payload):
    metadata = CheckpointMetadata.from_json(payload)
    assert metadata.to_json() == payload
    assert (checksummed_json(metadata.to_json(), METADATA_FORMAT)
            == checksummed_json(payload, METADATA_FORMAT))


def test_read_back_through_storage(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    storage.write_metadata("job", 4, CheckpointMetadata.from_json(UNALIGNED).to_json())
    metadata = CheckpointMetadata.from_json(storage.read_metadata("job", 4))
    assert metadata.channel_state["a#1"] == handle("a-1.channels")
    assert metadata.topology == "numbers -> sum"
    assert metadata.operators["sum"] == OperatorFiles(
        (handle("sum-0.op"),), (handle("sum-0.kg"), handle("sum-1.kg")))


@pytest.mark.parametrize("committed", [
    [handle("out-1"), handle("out-2")],  # before committed-output segments: a list
    {"recent": [handle("out-2")], "segment": handle("segment-1")}])
def test_an_older_checkpoint_still_restores(committed):
    # before watermark floors (none), and with the collect sink's output in the metadata
    old = {k: v for k, v in ALIGNED.items() if k not in ("watermarks", "coordinators")}
    old["committed"] = {"sink": committed}
    metadata = CheckpointMetadata.from_json(old)
    assert "committed" not in metadata.to_json()  # ignored: collect has a commit log now
    spec = restore_spec_of(4, metadata, "/ckpt")
    assert spec.operators["sum"].keyed_state == [StateHandle.from_json(handle("sum-0.kg")),
                                                 StateHandle.from_json(handle("sum-1.kg"))]
    assert spec.watermarks == {} and spec.channel_state == {} and spec.coordinators == {}


@pytest.mark.parametrize("bad", [{}, {"checkpoint_id": 1}, {**ALIGNED, "operators": [1]}])
def test_what_is_not_checkpoint_metadata_is_refused(bad):
    with pytest.raises(ValueError):
        CheckpointMetadata.from_json(bad)
