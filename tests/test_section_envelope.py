"""The envelope of key-group sections (checkpoint/envelope.py) and the three formats
that start with it: heap keyed state, disk keyed state, timers.

Oracles: section bytes written by raystream before the envelope module existed
(main at 9710b31, by the backends' and the timer service's own snapshots: the
state in ``write_state`` and ``write_timers`` below), and ``struct`` packing the
16 bytes every section has started with since (``>4sHHII``).
"""

from __future__ import annotations

import struct

import pytest

from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.envelope import (KEYED_STATE, Envelope, SectionKind, is_keyed_state,
                                           read)
from raystream.checkpoint.keygroups import HASH_VERSION, key_group_of
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.timers import TimerService

MAXP = 8
KEY = "alice"
KG = key_group_of(KEY, MAXP)  # 5
ENVELOPE = struct.Struct(">4sHHII")  # magic, format version, hash version, max_parallelism, kg

# Key group 5's sections, as main wrote them before this module (write_state / write_timers).
OLD_HEAP = bytes.fromhex(
    "52534b5300020001000000080000000580059534000000000000005d288c05636f756e748c0576616c7565"
    "4b01878c047365656e8c036d61704b01878c0677696e646f778c046c6973744b0187652e8005950c0000"
    "00000000007d8c05616c6963654b03732e80059518000000000000007d8c05616c6963657d8c0178473f"
    "f800000000000073732e80059543000000000000007d8c1a72617973747265616d2e636865636b706f69"
    "6e742e73746174658c0b5f4e616d657370616365649329815d288c05616c6963654b0a65625d284b014b"
    "0265732e")
OLD_DISK = bytes.fromhex(
    "52534b4400010001000000080000000500000028939300a5636f756e74a576616c75659301a47365656e"
    "a36d61709302a677696e646f77a46c69737400000000000a00000006a5616c696365000000010300010000"
    "000a00000006a5616c6963650000000c81a178cb3ff800000000000000020000000b00000006a5616c6963"
    "650a00000003920102")
OLD_TIMERS = bytes.fromhex(
    "5253544d000100010000000800000005000000000000000100000000000000010000000000000001cf07"
    "00000000000000000000000000000000000000000000881300000000000000000000000000000a000000"
    "000000008005950c000000000000005d948c05616c69636594612e")


def write_state(backend) -> None:
    backend.set_current_key(KEY)
    backend.value_state("count").update(3)
    backend.map_state("seen").put("x", 1.5)
    backend.set_namespace(10)
    backend.list_state("window").add_all([1, 2])


def write_timers(timers: TimerService) -> None:
    kid = timers.key_id(KEY, KG)
    timers.register_event_time_timer(kid, 0, 1999)
    timers.register_processing_time_timer(kid, 10, 5000)


def read_state(backend) -> dict:
    backend.set_current_key(KEY)
    backend.set_namespace(None)
    out = {"count": backend.value_state("count").value(),
           "seen": dict(backend.map_state("seen").items())}
    backend.set_namespace(10)
    out["window"] = backend.list_state("window").get()
    return out


STATE = {"count": 3, "seen": {"x": 1.5}, "window": [1, 2]}


@pytest.fixture
def disk(tmp_path):
    made = []

    def make(max_parallelism: int = MAXP) -> DiskKeyedStateBackend:
        made.append(DiskKeyedStateBackend(max_parallelism=max_parallelism,
                                          key_groups=range(max_parallelism),
                                          options=DiskStateOptions(local_dir=str(tmp_path))))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def heap(max_parallelism: int = MAXP) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(max_parallelism=max_parallelism,
                                 key_groups=range(max_parallelism))


def timer_service(max_parallelism: int = MAXP) -> TimerService:
    return TimerService(max_parallelism=max_parallelism, key_groups=range(max_parallelism))


@pytest.mark.parametrize("section", [OLD_HEAP, OLD_DISK], ids=["heap", "disk"])
def test_old_keyed_state_sections_restore_into_either_backend(disk, section):
    for backend in (heap(), disk()):
        backend.restore({KG: section})
        assert read_state(backend) == STATE


def test_old_timer_sections_restore():
    timers = timer_service()
    timers.restore({KG: OLD_TIMERS})
    ts, ids, ns = timers.advance_watermark(2000)
    assert (ts.tolist(), timers.keys(ids), ns.tolist()) == ([1999], [KEY], [0])
    ts, ids, ns = timers.fire_processing_time(5000)
    assert (ts.tolist(), timers.keys(ids), ns.tolist()) == ([5000], [KEY], [10])


def test_sections_are_written_byte_for_byte_as_before(disk):
    h, d = heap(), disk()
    write_state(h)
    write_state(d)
    timers = timer_service()
    write_timers(timers)
    assert h.snapshot()() == {KG: OLD_HEAP}
    assert d.snapshot()() == {KG: OLD_DISK}
    assert timers.snapshot()() == {KG: OLD_TIMERS}


@pytest.mark.parametrize("kind", list(SectionKind))
def test_envelope_layout(kind):
    envelope = Envelope.current(kind, max_parallelism=MAXP, key_group=KG)
    packed = envelope.pack()
    assert packed == ENVELOPE.pack(kind.value, kind.format_version, HASH_VERSION, MAXP, KG)
    assert len(packed) == Envelope.SIZE == ENVELOPE.size
    found, body = read(packed + b"body", key_group=KG, max_parallelism=MAXP, kinds=[kind])
    assert found == envelope and bytes(body) == b"body"
    assert is_keyed_state(packed) == (kind in KEYED_STATE)


def with_envelope(section: bytes, **changes) -> bytes:
    names = ["magic", "version", "hash_version", "max_parallelism", "key_group"]
    fields = list(ENVELOPE.unpack_from(section))
    for name, value in changes.items():
        fields[names.index(name)] = value
    return ENVELOPE.pack(*fields) + section[ENVELOPE.size:]


@pytest.mark.parametrize("section", [OLD_HEAP, OLD_DISK, OLD_TIMERS],
                         ids=["heap", "disk", "timers"])
def test_every_format_refuses_what_the_envelope_refuses(disk, section):
    kind = SectionKind(section[:4])
    make = {SectionKind.HEAP_STATE: heap, SectionKind.DISK_STATE: disk,
            SectionKind.TIMERS: timer_service}[kind]

    def restore(section: bytes, max_parallelism: int = MAXP) -> None:
        make(max_parallelism).restore({KG: section})

    if kind is SectionKind.TIMERS:
        other, found, wanted = OLD_HEAP, "a heap keyed-state section", "timer"
    else:
        other, found, wanted = OLD_TIMERS, "a timer section", "heap keyed-state, disk keyed-state or heap keyed-state changes"
    with pytest.raises(ValueError, match=f"key group {KG}: {found}, not a {wanted} section"):
        restore(with_envelope(section, magic=other[:4]))
    with pytest.raises(ValueError, match=r"unknown magic bytes b'XXXX'"):
        restore(with_envelope(section, magic=b"XXXX"))
    with pytest.raises(ValueError, match=f"unsupported {kind.noun} section format 9: this "
                                         f"raystream reads format {kind.format_version} "):
        restore(with_envelope(section, version=9))
    with pytest.raises(ValueError, match=f"hash version {HASH_VERSION + 1}, this raystream "
                                         f"uses {HASH_VERSION}"):
        restore(with_envelope(section, hash_version=HASH_VERSION + 1))
    with pytest.raises(ValueError, match=f"max_parallelism {MAXP}, restoring with 16: .*"
                                         f"set it back to {MAXP}"):
        restore(section, 16)
    with pytest.raises(ValueError, match=f"handed over as key group {KG} holds key group 4"):
        restore(with_envelope(section, key_group=4))
    with pytest.raises(ValueError, match="too short .*: truncated"):
        restore(section[:ENVELOPE.size - 1])


def test_is_keyed_state():
    assert is_keyed_state(OLD_HEAP) and is_keyed_state(OLD_DISK)
    assert not is_keyed_state(OLD_TIMERS)
    assert not is_keyed_state(b"RS") and not is_keyed_state(b"")
    assert HeapKeyedStateBackend.owns_section is DiskKeyedStateBackend.owns_section
    assert HeapKeyedStateBackend.owns_section(memoryview(OLD_DISK))
