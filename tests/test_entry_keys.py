"""EntryKeys: a batch's stored keys in RocksDB's (bytewise) order, checked against
Python's own sort of the same bytes, and the disk reduce path that reads and writes
with them against a dict."""

import numpy as np
import pytest

from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.entry_keys import EntryKeys
from raystream.checkpoint.keygroups import key_group_of

MAXP = 128


def _codes(rng: np.random.Generator, n: int) -> list[bytes]:
    # short codes over the whole byte range, many sharing prefixes, some empty, some equal
    alphabet = np.array([0, 1, 0x7F, 0x80, 0xFE, 0xFF], dtype=np.uint8)
    return [bytes(alphabet[rng.integers(0, len(alphabet), rng.integers(0, 4))])
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_keys_are_in_bytewise_order_and_map_back_to_the_callers(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    heads = rng.integers(0, 3, n).astype(">u2")
    codes = _codes(rng, n)
    keys = EntryKeys.build(heads, codes)
    raw = heads.tobytes()  # (a scalar taken out of a '>u2' array is native-endian)
    whole = [raw[2 * i:2 * i + 2] + c for i, c in enumerate(codes)]
    # the oracle: Python's stable sort of the same bytes, which compares them unsigned
    order = sorted(range(n), key=whole.__getitem__)
    assert keys.ordered == [whole[i] for i in order]
    assert keys.order == order  # equal keys keep the caller's order
    assert [keys.key(i) for i in range(n)] == whole
    assert keys.in_caller_order(keys.ordered) == whole
    assert len(keys) == n


def test_a_structured_head_comes_first_field_by_field():
    heads = np.zeros(2, dtype=[("group", ">u2"), ("length", ">u4")])
    heads["group"] = [1, 0]
    heads["length"] = [2, 1]
    keys = EntryKeys.build(heads, [b"ab", b"c"])
    assert keys.ordered == [b"\x00\x00\x00\x00\x00\x01c", b"\x00\x01\x00\x00\x00\x02ab"]


def test_batches_of_updates_read_what_a_dict_holds(tmp_path):
    """Keyed reduce's access: read a batch's keys, write them back; the values read are
    what a dict of the same writes holds, for keys of several types and key groups."""
    backend = DiskKeyedStateBackend(max_parallelism=MAXP, key_groups=range(MAXP),
                                    options=DiskStateOptions(local_dir=str(tmp_path)))
    state = backend.value_state("sum")
    oracle: dict = {}
    rng = np.random.default_rng(7)
    universe = ([int(k) for k in rng.integers(-2**40, 2**40, 300)]
                + [f"k{i}é" for i in range(200)] + [("t", i) for i in range(100)] + [2**63, -1])
    try:
        for _ in range(20):
            picked = rng.choice(len(universe), 150, replace=False)
            batch = [universe[i] for i in picked.tolist()]
            stored = state.entry_keys(batch, [key_group_of(k, MAXP) for k in batch])
            assert state.values_at(stored) == [oracle.get(repr(k)) for k in batch]
            values = [{"n": (oracle.get(repr(k)) or {"n": 0})["n"] + 1, "k": str(k)}
                      for k in batch]
            state.update_at(stored, values)
            oracle.update({repr(k): v for k, v in zip(batch, values)})
        for k in universe:
            backend.set_current_key(k)
            assert state.value() == oracle.get(repr(k))
    finally:
        backend.close()
