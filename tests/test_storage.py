"""Checkpoint storage: round trips, listing, checksums, fallback, atomic commit (no Ray needed).

Every assertion compares with an independent oracle: the bytes and payloads the
test wrote, SHA-256 computed here with hashlib, files read back with plain
``open`` or the raw filesystem.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import pickle
import stat
import subprocess
import sys
import tempfile
import textwrap

import pyarrow.fs as pafs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream.checkpoint.storage as storage_mod
from raystream.checkpoint.storage import (CheckpointStorage, CorruptCheckpointError, StateHandle,
                                          StorageUnavailableError)
from raystream.engine.errors import RaystreamError

JOB = "job-a"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(payload: dict) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def raw_read(storage: CheckpointStorage, path: str) -> bytes:
    with storage.filesystem.open_input_stream(path, compression=None) as f:
        return f.read()


def raw_write(storage: CheckpointStorage, path: str, data: bytes) -> None:
    with storage.filesystem.open_output_stream(path, compression=None) as f:
        f.write(data)


def all_files(storage: CheckpointStorage) -> set[str]:
    infos = storage.filesystem.get_file_info(
        pafs.FileSelector(storage.root, recursive=True, allow_not_found=True))
    return {i.path for i in infos if i.type == pafs.FileType.File}


def make_checkpoint(storage: CheckpointStorage, cid: int, states: dict[str, bytes],
                    job: str = JOB, extra: dict | None = None) -> tuple[list[StateHandle], dict]:
    handles = [storage.write_state(job, cid, name, data) for name, data in states.items()]
    meta = {"checkpoint_id": cid, "handles": [h.to_json() for h in handles], **(extra or {})}
    storage.write_metadata(job, cid, meta)
    return handles, meta


@pytest.fixture(params=["local", "mock"])
def storage(request, tmp_path) -> CheckpointStorage:
    if request.param == "local":
        return CheckpointStorage(str(tmp_path / "ckpts"))
    return CheckpointStorage("mock:///ckpts/root")


@pytest.fixture
def local(tmp_path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "ckpts"))


# -- construction ------------------------------------------------------------


def test_uri_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = CheckpointStorage("rel/dir")
    assert rel.is_local and rel.root == str(tmp_path / "rel" / "dir")
    f = CheckpointStorage(f"file://{tmp_path}/x/")
    assert f.is_local and f.root == f"{tmp_path}/x"
    m = CheckpointStorage("mock:///bucket/prefix")
    assert not m.is_local and m.root == "bucket/prefix"
    assert rel.checkpoint_dir("j", 12) == f"{tmp_path}/rel/dir/j/chk-12"
    assert m.checkpoint_dir("j", 3) == "bucket/prefix/j/chk-3"
    assert CheckpointStorage("mock://").checkpoint_dir("j", 3) == "j/chk-3"


@pytest.mark.parametrize("job_key", ["", ".", "..", "a/b", "a\\b"])
def test_bad_job_key_rejected(local, job_key):
    with pytest.raises(ValueError):
        local.write_state(job_key, 1, "s", b"x")


@pytest.mark.parametrize("name", ["", "../x", "a//b", "/abs", "_metadata", "_metadata/x", "a/./b"])
def test_bad_state_name_rejected(local, name):
    with pytest.raises(ValueError):
        local.write_state(JOB, 1, name, b"x")
    assert all_files(local) == set()


@pytest.mark.parametrize("cid", [-1, 1.0, True, "1"])
def test_bad_checkpoint_id_rejected(local, cid):
    with pytest.raises(ValueError):
        local.checkpoint_dir(JOB, cid)


# -- state -------------------------------------------------------------------


@given(data=st.binary(max_size=2000), chunk=st.integers(1, 300))
def test_state_round_trip_any_bytes_and_chunking(data, chunk):
    # hypothesis and function-scoped fixtures do not mix: one fresh dir per example
    orig = storage_mod._CHUNK
    storage_mod._CHUNK = chunk  # many chunk boundaries through small data
    try:
        for s in (CheckpointStorage(tempfile.mkdtemp()), CheckpointStorage("mock:///r")):
            h = s.write_state(JOB, 1, "op/kg-0", data)
            assert (h.size, h.sha256) == (len(data), sha(data))
            assert h.path == f"{s.root}/{JOB}/chk-1/op/kg-0"
            assert raw_read(s, h.path) == data
            assert s.read_state(h) == data
            assert s.read_state(StateHandle.from_json(json.loads(json.dumps(h.to_json())))) == data
    finally:
        storage_mod._CHUNK = orig


def test_state_from_memoryview_of_typed_buffer(storage):
    arr = array.array("q", range(-500, 500))
    h = storage.write_state(JOB, 2, "ints", memoryview(arr))
    expected = arr.tobytes()
    assert (h.size, h.sha256) == (len(expected), sha(expected))
    assert storage.read_state(h) == expected
    ba = bytearray(b"\x00\xff" * 10)
    assert storage.read_state(storage.write_state(JOB, 2, "ba", ba)) == bytes(ba)


def test_large_state_streams_across_chunks(local):
    data = os.urandom((8 << 20) * 2 + 12345)  # > 2 default chunks
    h = local.write_state(JOB, 1, "big", data)
    with open(h.path, "rb") as f:
        assert f.read() == data
    assert h.sha256 == sha(data)
    assert local.read_state(h) == data


def test_local_state_is_fsynced(local, monkeypatch):
    synced = []
    real = os.fsync

    def rec(fd):
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(storage_mod.os, "fsync", rec)
    h = local.write_state(JOB, 1, "s", b"abc")
    assert os.stat(h.path).st_ino in synced


# -- metadata ----------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8) | \
    st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


@given(payload=st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_metadata_round_trip_any_json(payload):
    for s in (CheckpointStorage(tempfile.mkdtemp()), CheckpointStorage("mock:///r")):
        h = s.write_metadata(JOB, 7, payload)
        assert s.read_metadata(JOB, 7) == payload
        raw = raw_read(s, h.path)
        assert (h.size, h.sha256) == (len(raw), sha(raw))
        doc = json.loads(raw)  # JSON on disk, the checksum is over the canonical payload
        assert doc["format"] == 1 and doc["payload"] == payload
        assert doc["sha256"] == sha(canonical(payload))


def test_metadata_tuples_read_back_as_lists(local):
    local.write_metadata(JOB, 1, {"ranges": [(0, 63), (64, 127)]})
    assert local.read_metadata(JOB, 1) == {"ranges": [[0, 63], [64, 127]]}


@pytest.mark.parametrize("bad, exc", [({1: "x"}, TypeError), ({"a": {2: 3}}, TypeError),
                                      ({"a": [{None: 1}]}, TypeError), ({"a": float("nan")}, ValueError),
                                      ({"a": object()}, TypeError), (["not", "a", "dict"], TypeError)])
def test_metadata_must_be_json_with_string_keys(local, bad, exc):
    with pytest.raises(exc):
        local.write_metadata(JOB, 1, bad)
    assert local.completed_checkpoint_ids(JOB) == []


def test_metadata_is_never_overwritten(storage):
    storage.write_metadata(JOB, 1, {"v": 1})
    with pytest.raises(FileExistsError):
        storage.write_metadata(JOB, 1, {"v": 2})
    assert storage.read_metadata(JOB, 1) == {"v": 1}


def test_local_commit_protocol_order(local, monkeypatch):
    """temp file written and fsynced, renamed onto _metadata, then the directories fsynced."""
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        st_ = os.fstat(fd)
        events.append(("fsync-dir" if stat.S_ISDIR(st_.st_mode) else "fsync-file", st_.st_ino))
        real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", os.stat(src).st_ino, os.path.dirname(src), dst))
        real_rename(src, dst)

    monkeypatch.setattr(storage_mod.os, "fsync", fsync)
    monkeypatch.setattr(storage_mod.os, "rename", rename)
    h = local.write_metadata(JOB, 3, {"x": 1})
    chk = local.checkpoint_dir(JOB, 3)
    assert h.path == f"{chk}/_metadata"
    ino = os.stat(h.path).st_ino
    kinds = [e[0] for e in events]
    assert kinds[:2] == ["fsync-file", "rename"]
    assert events[0][1] == ino and events[1][1] == ino  # the very file that became _metadata
    assert events[1][2:] == (chk, h.path)  # temp file in the same directory
    dirs_synced = [e[1] for e in events[2:] if e[0] == "fsync-dir"]
    for d in (chk, local.job_dir(JOB), local.root):
        assert os.stat(d).st_ino in dirs_synced
    assert os.listdir(chk) == ["_metadata"]


class RecordingHandler(pafs.FileSystemHandler):
    """Delegates to an in-memory filesystem and records the calls (no rename allowed)."""

    def __init__(self, fs: pafs.FileSystem):
        self.fs, self.calls = fs, []

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return "recording"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.fs.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.calls.append(("move", src, dest))
        raise AssertionError("object stores have no atomic rename: move must not be used")

    def copy_file(self, src, dest):
        self.calls.append(("copy", src, dest))
        raise AssertionError("copy must not be used")

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path, compression=None)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        self.calls.append(("put", path))
        return self.fs.open_output_stream(path, compression=None)

    def open_append_stream(self, path, metadata):
        raise AssertionError("append must not be used")


def test_object_store_metadata_is_one_put_of_the_final_key():
    s = CheckpointStorage("mock:///bucket/ckpts")
    handler = RecordingHandler(s.filesystem)
    s.filesystem = pafs.PyFileSystem(handler)
    states = {"a": b"alpha" * 100, "b": b""}
    handles, meta = make_checkpoint(s, 4, states)
    chk = "bucket/ckpts/job-a/chk-4"
    assert handler.calls == [("put", f"{chk}/a"), ("put", f"{chk}/b"), ("put", f"{chk}/_metadata")]
    assert all_files(s) == {f"{chk}/a", f"{chk}/b", f"{chk}/_metadata"}  # no temp file anywhere
    assert s.read_metadata(JOB, 4) == meta
    for h, (name, data) in zip(handles, states.items()):
        assert raw_read(s, h.path) == data and h.sha256 == sha(data)
    assert s.latest_valid_checkpoint(JOB) == (4, meta)


# -- listing and ids ---------------------------------------------------------


def test_ids_listing_and_highest_with_incomplete_dirs(storage):
    assert storage.completed_checkpoint_ids(JOB) == [] and storage.highest_checkpoint_id(JOB) == 0
    for cid in (1, 3, 10):
        make_checkpoint(storage, cid, {"s": b"x%d" % cid})
    storage.write_state(JOB, 12, "s", b"in progress")  # incomplete: no _metadata
    storage.write_state(JOB, 2, "s", b"aborted")
    job = storage.job_dir(JOB)
    for junk in ("chk-abc", "chk-007", "chk-", "shared", "chk-5x"):
        storage.filesystem.create_dir(f"{job}/{junk}")
        raw_write(storage, f"{job}/{junk}/_metadata", b"{}")
    raw_write(storage, f"{job}/chk-99", b"a file, not a checkpoint dir")
    storage.filesystem.create_dir(f"{job}/chk-11/_metadata")  # a directory is not the commit file
    assert storage.completed_checkpoint_ids(JOB) == [1, 3, 10]
    assert storage.highest_checkpoint_id(JOB) == 12
    # a restart (a new storage object on the same root) keeps ids monotonic
    again = storage if not storage.is_local else CheckpointStorage(storage.root)
    assert again.highest_checkpoint_id(JOB) == 12
    storage.discard(JOB, 12)
    assert storage.highest_checkpoint_id(JOB) == 11  # chk-11 holds no commit file, but is a checkpoint dir
    assert storage.highest_checkpoint_id("other-job") == 0
    assert storage.completed_checkpoint_ids("other-job") == []


def test_discard(storage):
    make_checkpoint(storage, 1, {"s": b"one"})
    h2, m2 = make_checkpoint(storage, 2, {"s": b"two", "nested/t": b"2"})
    storage.discard(JOB, 1)
    assert storage.filesystem.get_file_info(storage.checkpoint_dir(JOB, 1)).type == pafs.FileType.NotFound
    assert storage.completed_checkpoint_ids(JOB) == [2]
    storage.discard(JOB, 1)  # missing is fine
    storage.discard(JOB, 77)
    storage.discard("never-existed", 1)
    assert [storage.read_state(h) for h in h2] == [b"two", b"2"]
    assert storage.latest_valid_checkpoint(JOB) == (2, m2)


# -- corruption --------------------------------------------------------------


def flip(storage: CheckpointStorage, path: str, pos: int, mask: int) -> None:
    data = bytearray(raw_read(storage, path))
    data[pos] ^= mask
    raw_write(storage, path, bytes(data))


@given(pos=st.integers(0, 299), mask=st.integers(1, 255))
def test_one_flipped_byte_of_state_is_detected(pos, mask):
    s = CheckpointStorage(tempfile.mkdtemp())
    data = bytes(range(256)) + b"tail" * 11
    h = s.write_state(JOB, 1, "s", data)
    flip(s, h.path, pos, mask)
    with pytest.raises(CorruptCheckpointError, match="checksum") as e:
        s.read_state(h)
    assert e.value.path == h.path and h.path in str(e.value)


def test_any_flipped_byte_of_metadata_is_detected():
    s = CheckpointStorage(tempfile.mkdtemp())
    payload = {"checkpoint_id": 1, "ok": True, "name": "abc", "xs": [1, 2.5, None],
               "handles": [{"path": "/p/s", "size": 3, "sha256": sha(b"abc")}]}
    h = s.write_metadata(JOB, 1, payload)
    original = raw_read(s, h.path)
    with open(h.path, "r+b") as f:
        for pos in range(len(original)):  # every position, every single-bit flip, and a whole-byte flip
            for mask in (1, 2, 4, 8, 16, 32, 64, 128, 255):
                f.seek(pos)
                f.write(bytes([original[pos] ^ mask]))
                f.flush()
                with pytest.raises(CorruptCheckpointError) as e:
                    s.read_metadata(JOB, 1)
                assert e.value.path == h.path and h.path in str(e.value)
                f.seek(pos)
                f.write(original[pos:pos + 1])
    assert raw_read(s, h.path) == original
    assert s.read_metadata(JOB, 1) == payload


def test_truncated_and_overlong_state(storage):
    data = b"0123456789" * 50
    h = storage.write_state(JOB, 1, "s", data)
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        raw_write(storage, h.path, data[:cut])
        with pytest.raises(CorruptCheckpointError, match="truncated") as e:
            storage.read_state(h)
        assert e.value.path == h.path and h.path in str(e.value)
    raw_write(storage, h.path, data + b"!")
    with pytest.raises(CorruptCheckpointError, match="size") as e:
        storage.read_state(h)
    assert e.value.path == h.path


def test_truncated_metadata(storage):
    h = storage.write_metadata(JOB, 1, {"a": list(range(20))})
    raw = raw_read(storage, h.path)
    for cut in range(len(raw)):
        raw_write(storage, h.path, raw[:cut])
        with pytest.raises(CorruptCheckpointError) as e:
            storage.read_metadata(JOB, 1)
        assert e.value.path == h.path and h.path in str(e.value)


def test_missing_files(storage):
    h = storage.write_state(JOB, 1, "s", b"abc")
    storage.filesystem.delete_file(h.path)
    with pytest.raises(CorruptCheckpointError, match="missing") as e:
        storage.read_state(h)
    assert e.value.path == h.path
    with pytest.raises(CorruptCheckpointError, match="missing") as e:
        storage.read_metadata(JOB, 5)
    assert e.value.path == f"{storage.checkpoint_dir(JOB, 5)}/_metadata"


def test_unparsable_metadata(local):
    path = f"{local.checkpoint_dir(JOB, 1)}/_metadata"
    os.makedirs(os.path.dirname(path))
    for content in (b"\xff\xfe garbage", b"[1, 2]", b'{"format": 1}',
                    b'{"format": 2, "sha256": "", "payload": {}}',
                    b'{"format": 1, "sha256": "", "payload": []}'):
        with open(path, "wb") as f:
            f.write(content)
        with pytest.raises(CorruptCheckpointError) as e:
            local.read_metadata(JOB, 1)
        assert e.value.path == path


def test_error_is_a_raystream_error_and_pickles():
    e = CorruptCheckpointError("/x/chk-1/_metadata", "checksum mismatch")
    assert isinstance(e, RaystreamError)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.path, back.reason, str(back)) == (type(e), e.path, e.reason, str(e))


def test_state_handle_json():
    h = StateHandle("/a/b", 3, sha(b"abc"))
    assert StateHandle.from_json(json.loads(json.dumps(h.to_json()))) == h
    for bad in ({}, {"path": "/a", "size": -1, "sha256": sha(b"")}, {"path": "/a", "size": True,
                "sha256": sha(b"")}, {"path": "/a", "size": 1, "sha256": "xyz"}, None):
        with pytest.raises(ValueError):
            StateHandle.from_json(bad)


# -- choosing a checkpoint to restore ----------------------------------------


def test_latest_valid_falls_back_past_corrupt_state(storage, caplog):
    make_checkpoint(storage, 1, {"s": b"one"})
    _, m2 = make_checkpoint(storage, 2, {"s": b"two", "t": b"2"})
    h3, m3 = make_checkpoint(storage, 3, {"s": b"three", "t": b"3"})
    assert storage.latest_valid_checkpoint(JOB) == (3, m3)
    flip(storage, h3[1].path, 0, 0x01)
    with caplog.at_level(logging.WARNING, logger="raystream.checkpoint.storage"):
        assert storage.latest_valid_checkpoint(JOB) == (2, m2)
    assert h3[1].path in caplog.text
    # output was committed for 3: falling back would duplicate it
    with pytest.raises(CorruptCheckpointError, match="must not be skipped") as e:
        storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 3)
    assert e.value.path == h3[1].path and h3[1].path in str(e.value)
    # committed up to 2 only: 3 may be skipped
    assert storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid <= 2) == (2, m2)
    # a truncated state file is reported as such
    raw_write(storage, h3[1].path, b"")
    with pytest.raises(CorruptCheckpointError, match="truncated") as e:
        storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 3)
    assert e.value.path == h3[1].path


def test_latest_valid_falls_back_past_corrupt_or_missing_metadata(storage, caplog):
    _, m1 = make_checkpoint(storage, 1, {"s": b"one"})
    make_checkpoint(storage, 2, {"s": b"two"})
    meta2 = f"{storage.checkpoint_dir(JOB, 2)}/_metadata"
    flip(storage, meta2, 40, 0x20)
    h3, _ = make_checkpoint(storage, 3, {"s": b"three"})
    storage.filesystem.delete_file(h3[0].path)
    storage.write_state(JOB, 4, "s", b"in progress, no metadata")
    with caplog.at_level(logging.WARNING, logger="raystream.checkpoint.storage"):
        assert storage.latest_valid_checkpoint(JOB) == (1, m1)
    assert meta2 in caplog.text and h3[0].path in caplog.text
    with pytest.raises(CorruptCheckpointError) as e:
        storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 2)
    assert e.value.path == meta2
    with pytest.raises(CorruptCheckpointError, match="missing") as e:
        storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 3)
    assert e.value.path == h3[0].path
    # a committed checkpoint whose metadata never appeared (or was deleted) is not skipped silently
    with pytest.raises(CorruptCheckpointError, match="missing") as e:
        storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 4)
    assert e.value.path == f"{storage.checkpoint_dir(JOB, 4)}/_metadata"


def test_latest_valid_none_and_without_handles(storage):
    assert storage.latest_valid_checkpoint(JOB) is None
    storage.write_state(JOB, 1, "s", b"x")
    assert storage.latest_valid_checkpoint(JOB) is None
    storage.write_metadata(JOB, 2, {"no": "handles"})
    assert storage.latest_valid_checkpoint(JOB) == (2, {"no": "handles"})


def test_malformed_handles_in_metadata_are_corruption(local):
    local.write_metadata(JOB, 1, {"handles": [{"path": "/x"}]})
    local.write_metadata(JOB, 2, {"handles": "nope"})
    assert local.latest_valid_checkpoint(JOB) is None
    with pytest.raises(CorruptCheckpointError) as e:
        local.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: cid == 1)
    assert e.value.path == f"{local.checkpoint_dir(JOB, 1)}/_metadata"


# -- unwritable locations and crashes ---------------------------------------


def test_unwritable_root_raises_oserror(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    s = CheckpointStorage(str(blocker / "ckpts"))
    with pytest.raises(OSError):
        s.write_state(JOB, 1, "s", b"x")
    with pytest.raises(OSError):
        s.write_metadata(JOB, 1, {})
    assert blocker.read_bytes() == b"not a directory"


def test_failed_rename_leaves_no_metadata_and_no_temp(local, monkeypatch):
    def boom(src, dst):
        raise OSError("disk went away")

    make_checkpoint(local, 1, {"s": b"one"})
    local.write_state(JOB, 2, "s", b"two")
    monkeypatch.setattr(storage_mod.os, "rename", boom)
    with pytest.raises(OSError, match="disk went away"):
        local.write_metadata(JOB, 2, {"handles": []})
    assert sorted(os.listdir(local.checkpoint_dir(JOB, 2))) == ["s"]
    assert local.completed_checkpoint_ids(JOB) == [1]


CRASH = textwrap.dedent("""
    import os, sys
    import raystream.checkpoint.storage as m
    def crash(src, dst):
        os._exit(17)  # the process dies after the temp file is written, before the rename
    m.os.rename = crash
    s = m.CheckpointStorage(sys.argv[1])
    h = s.write_state("job-a", 2, "s", b"two")
    s.write_metadata("job-a", 2, {"handles": [h.to_json()]})
""")


def test_crash_between_temp_write_and_rename(local):
    _, m1 = make_checkpoint(local, 1, {"s": b"one"})
    proc = subprocess.run([sys.executable, "-c", CRASH, local.root], capture_output=True, timeout=120)
    assert proc.returncode == 17, proc.stderr.decode()
    chk2 = local.checkpoint_dir(JOB, 2)
    leftovers = sorted(set(os.listdir(chk2)) - {"s"})
    assert len(leftovers) == 1 and leftovers[0] != "_metadata"  # the temp file of the crashed write
    with open(f"{chk2}/{leftovers[0]}", "rb") as f:
        assert json.loads(f.read())["payload"]["handles"][0]["sha256"] == sha(b"two")
    assert local.completed_checkpoint_ids(JOB) == [1]
    assert local.highest_checkpoint_id(JOB) == 2
    assert local.latest_valid_checkpoint(JOB) == (1, m1)
    # the next attempt may use the next id; the leftover does not block anything
    _, m3 = make_checkpoint(local, 3, {"s": b"three"})
    assert local.latest_valid_checkpoint(JOB) == (3, m3)


def test_storage_pickles_for_ray(local):
    h = local.write_state(JOB, 1, "s", b"abc")
    other = pickle.loads(pickle.dumps(local))
    assert other.root == local.root and other.is_local
    assert other.read_state(h) == b"abc"


def test_sink_output_is_written_once_and_never_rewritten(local, monkeypatch):
    """A sink that writes the same file again (a retry) must not touch the file a completed
    checkpoint may have committed already: a process that dies midway through a rewrite
    (here: its fsync fails) would corrupt committed output."""
    first = local.write_output(JOB, "collect/3-0-0.arrow", b"rows of origin 3")

    def dying(fd):
        raise OSError(5, "the process dies here")
    monkeypatch.setattr(os, "fsync", dying)
    again = local.write_output(JOB, "collect/3-0-0.arrow", b"rows of origin 3")
    monkeypatch.undo()
    assert again == first
    assert local.read_state(first) == b"rows of origin 3"
    assert os.listdir(os.path.dirname(first.path)) == ["3-0-0.arrow"]  # no temporary left


def test_sink_output_on_an_object_store_is_one_put(storage):
    handle = storage.write_output(JOB, "collect/4-1-0.arrow", b"rows")
    assert storage.write_output(JOB, "collect/4-1-0.arrow", b"rows") == handle
    assert storage.read_state(handle) == b"rows"


def test_collect_output_listed_by_an_older_checkpoint_is_ignored(storage):
    """Checkpoints taken before the collect sink kept its own commit log listed its files
    in ``committed``; that list is no longer read, so a damaged file there does not stop
    the checkpoint from restoring."""
    output = storage.write_output(JOB, "collect/1-0-0.arrow", b"committed rows")
    make_checkpoint(storage, 1, {"a": b"state"}, extra={"committed": {"collect": [output.to_json()]}})
    raw_write(storage, output.path, b"committed rowz")  # same size, one byte flipped
    assert storage.latest_valid_checkpoint(JOB, must_not_skip=lambda cid: True)[0] == 1


def test_a_file_is_missing_only_where_the_storage_itself_is_there(local, tmp_path):
    """With the storage root gone (here: a regular file in its place), a checkpoint's
    files are unreadable, not corrupt: a restore must retry, not give up on them."""
    make_checkpoint(local, 1, {"a": b"state"})
    assert local.verified_metadata(JOB, 1)["checkpoint_id"] == 1
    root = tmp_path / "ckpts"
    root.rename(tmp_path / "away")
    root.write_text("not a directory")
    with pytest.raises(StorageUnavailableError, match="is not reachable"):
        local.verified_metadata(JOB, 1)
    root.unlink()
    (tmp_path / "away").rename(root)
    assert local.verified_metadata(JOB, 1)["checkpoint_id"] == 1
    os.remove(root / JOB / "chk-1" / "a")  # really missing: corrupt
    with pytest.raises(CorruptCheckpointError, match="missing"):
        local.verified_metadata(JOB, 1)
