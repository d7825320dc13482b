"""Key groups: golden hash values, per-row vs vectorized agreement, range assignment."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import raystream as rs
from raystream.checkpoint.keygroups import (DEFAULT_MAX_PARALLELISM, key_group_of,
                                            key_group_range, key_groups_of_array, key_hashes,
                                            murmur3_32, subtask_for_key_group)

pytestmark = pytest.mark.timeout(120)

INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
MAX_PARALLELISMS = st.sampled_from([1, 2, 7, 128, 1000, 32768])
# empty, short, and long (> 100 characters) unicode strings
TEXT = st.one_of(st.just(""), st.text(max_size=12), st.text(min_size=101, max_size=300))


# ---------------------------------------------------------------------------
# Golden values (published murmur3 x86_32 test vectors)
# ---------------------------------------------------------------------------

SEED0_VECTORS = [
    (b"", 0),
    (b"hello", 0x248BFA47),
    (b"The quick brown fox jumps over the lazy dog", 0x2E4FF723),
    (b"abc", 0xB3DD93FA),
    (b"\x00", 0x514E28B7),
    (b"\x00\x00", 0x30F4C306),
    (b"\x00\x00\x00", 0x85F0B427),
    (b"\x00\x00\x00\x00", 0x2362F9DE),
    (b"\x21", 0x72661CF4),
    (b"\x21\x43", 0xA0F7B07A),
    (b"\x21\x43\x65", 0x7E4A8634),
    (b"\x21\x43\x65\x87", 0xF55B516B),
    (b"\xff\xff\xff\xff", 0x76293B50),
]

SEEDED_VECTORS = [
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"aa", 0x9747B28C, 0x5D211726),
    (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    ("ππππππππ".encode("utf-8"), 0x9747B28C, 0xD58063C1),
    (b"a" * 256, 0x9747B28C, 0x37405BDC),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


@pytest.mark.parametrize("data,expected", SEED0_VECTORS)
def test_murmur3_32_seed0_vectors(data, expected):
    assert murmur3_32(data) == expected
    assert murmur3_32(data, 0) == expected


@pytest.mark.parametrize("data,seed,expected", SEEDED_VECTORS)
def test_murmur3_32_seeded_vectors(data, seed, expected):
    assert murmur3_32(data, seed) == expected


def test_vectorized_string_hash_matches_published_vectors():
    """The vectorized path (binary and string columns) reproduces the seed-0 vectors."""
    data = [d for d, _ in SEED0_VECTORS]
    expected = np.array([e for _, e in SEED0_VECTORS], dtype=np.uint64)
    np.testing.assert_array_equal(key_hashes([pa.array(data, type=pa.binary())]), expected)
    np.testing.assert_array_equal(key_hashes([pa.array(data, type=pa.large_binary())]), expected)
    text = [b"", b"hello", b"The quick brown fox jumps over the lazy dog", b"abc"]
    np.testing.assert_array_equal(
        key_hashes([pa.array([t.decode() for t in text], type=pa.string())]),
        np.array([murmur3_32(t) for t in text], dtype=np.uint64))


def test_string_key_group_is_murmur3_of_utf8_mod_max_parallelism():
    for max_parallelism in (128, 1000, 7):
        assert key_group_of("hello", max_parallelism) == 0x248BFA47 % max_parallelism
        assert key_group_of("", max_parallelism) == 0
        assert key_group_of("The quick brown fox jumps over the lazy dog", max_parallelism) \
            == 0x2E4FF723 % max_parallelism
        assert key_group_of(b"hello", max_parallelism) == 0x248BFA47 % max_parallelism
        got = key_groups_of_array(pa.array(["hello", "", "hello"]), max_parallelism=max_parallelism)
        assert got.tolist() == [0x248BFA47 % max_parallelism, 0, 0x248BFA47 % max_parallelism]


def test_hash_version_exported():
    assert rs.HASH_VERSION == 1
    assert DEFAULT_MAX_PARALLELISM == 128


# ---------------------------------------------------------------------------
# Per-row vs vectorized agreement
# ---------------------------------------------------------------------------

def _per_row(keys, max_parallelism):
    return np.array([key_group_of(k, max_parallelism) for k in keys], dtype=np.int64)


def _check_in_range(groups, max_parallelism, n):
    assert groups.dtype == np.int64 and groups.shape == (n,)
    assert ((groups >= 0) & (groups < max_parallelism)).all()


@given(st.lists(INT64, max_size=50), MAX_PARALLELISMS)
def test_ints_per_row_matches_vectorized(values, max_parallelism):
    got = key_groups_of_array(pa.array(values, type=pa.int64()), max_parallelism=max_parallelism)
    _check_in_range(got, max_parallelism, len(values))
    np.testing.assert_array_equal(got, _per_row(values, max_parallelism))
    # numpy integer scalars hash like Python ints
    np.testing.assert_array_equal(
        got, _per_row([np.int64(v) for v in values], max_parallelism))


@given(st.lists(st.integers(-(2 ** 31), 2 ** 31 - 1), max_size=40),
       st.lists(st.integers(0, 255), max_size=40), MAX_PARALLELISMS)
def test_narrow_int_columns_hash_like_int64(i32, u8, max_parallelism):
    for values, type_ in ((i32, pa.int32()), (u8, pa.uint8())):
        arr = pa.array(values, type=type_)
        got = key_groups_of_array(arr, max_parallelism=max_parallelism)
        np.testing.assert_array_equal(got, _per_row(values, max_parallelism))
        np.testing.assert_array_equal(
            got, key_groups_of_array(pa.array(values, type=pa.int64()),
                                     max_parallelism=max_parallelism))


@given(st.lists(st.booleans(), max_size=20))
def test_bools_per_row_matches_vectorized(values):
    np.testing.assert_array_equal(key_groups_of_array(pa.array(values, type=pa.bool_())),
                                  _per_row(values, 128))


@given(st.lists(TEXT, max_size=30), MAX_PARALLELISMS)
def test_strings_per_row_matches_vectorized(values, max_parallelism):
    expected = _per_row(values, max_parallelism)
    for type_ in (pa.string(), pa.large_string()):
        got = key_groups_of_array(pa.array(values, type=type_), max_parallelism=max_parallelism)
        _check_in_range(got, max_parallelism, len(values))
        np.testing.assert_array_equal(got, expected)
    # the reference implementation directly: murmur3 of the UTF-8 bytes
    np.testing.assert_array_equal(
        expected, np.array([murmur3_32(v.encode("utf-8")) % max_parallelism for v in values],
                           dtype=np.int64))


@given(st.lists(TEXT, min_size=1, max_size=30), st.data())
def test_sliced_and_chunked_strings_match(values, data):
    start = data.draw(st.integers(0, len(values)))
    stop = data.draw(st.integers(start, len(values)))
    arr = pa.array(values).slice(start, stop - start)  # non-zero offset into the buffers
    np.testing.assert_array_equal(key_groups_of_array(arr), _per_row(values[start:stop], 128))
    chunked = pa.chunked_array([pa.array(values[:start], pa.string()),
                                pa.array(values[start:], pa.string())])
    np.testing.assert_array_equal(key_groups_of_array(chunked), _per_row(values, 128))


@given(st.lists(st.binary(max_size=150), max_size=30))
def test_bytes_per_row_matches_vectorized(values):
    np.testing.assert_array_equal(key_groups_of_array(pa.array(values, type=pa.binary())),
                                  _per_row(values, 128))


@given(st.lists(TEXT, min_size=1, max_size=8, unique=True), st.data(), MAX_PARALLELISMS)
def test_dictionary_encoded_strings_match(dictionary, data, max_parallelism):
    indices = data.draw(st.lists(st.integers(0, len(dictionary) - 1), max_size=40))
    arr = pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()),
                                         pa.array(dictionary, type=pa.string()))
    got = key_groups_of_array(arr, max_parallelism=max_parallelism)
    np.testing.assert_array_equal(got, _per_row([dictionary[i] for i in indices], max_parallelism))
    plain = pa.array([dictionary[i] for i in indices], type=pa.string())
    np.testing.assert_array_equal(
        key_groups_of_array(plain.dictionary_encode(), max_parallelism=max_parallelism), got)


@given(st.lists(st.floats(allow_nan=False), max_size=40),
       st.lists(st.floats(allow_nan=False, width=32), max_size=20), MAX_PARALLELISMS)
def test_floats_per_row_matches_vectorized(values, f32, max_parallelism):
    values = values + [-0.0, 0.0]
    got = key_groups_of_array(pa.array(values, type=pa.float64()), max_parallelism=max_parallelism)
    np.testing.assert_array_equal(got, _per_row(values, max_parallelism))
    # float32 columns hash their float64 value
    np.testing.assert_array_equal(
        key_groups_of_array(pa.array(f32, type=pa.float32()), max_parallelism=max_parallelism),
        _per_row(f32, max_parallelism))


def test_negative_zero_is_folded_to_zero():
    for max_parallelism in (128, 32768):
        assert key_group_of(-0.0, max_parallelism) == key_group_of(0.0, max_parallelism)
        got = key_groups_of_array(pa.array([-0.0, 0.0]), max_parallelism=max_parallelism)
        assert got[0] == got[1] == key_group_of(0.0, max_parallelism)


@given(st.lists(st.tuples(INT64, TEXT), max_size=30), MAX_PARALLELISMS)
def test_composite_int_str_keys_match(rows, max_parallelism):
    ints = pa.array([i for i, _ in rows], type=pa.int64())
    strs = pa.array([s for _, s in rows], type=pa.string())
    got = key_groups_of_array(ints, strs, max_parallelism=max_parallelism)
    np.testing.assert_array_equal(got, _per_row(rows, max_parallelism))
    # the composite is not just one of its parts: order of parts matters in general
    swapped = key_groups_of_array(strs, ints, max_parallelism=max_parallelism)
    np.testing.assert_array_equal(swapped, _per_row([(s, i) for i, s in rows], max_parallelism))


def test_composite_key_definition():
    """``h = fmix64(h0 * 31 + h1)`` over uint64, written out independently here."""
    def fmix64(k):
        m = (1 << 64) - 1
        k ^= k >> 33
        k = (k * 0xFF51AFD7ED558CCD) & m
        k ^= k >> 33
        k = (k * 0xC4CEB9FE1A85EC53) & m
        k ^= k >> 33
        return k

    h_str = murmur3_32(b"hello")
    for i in (0, 1, -1, 2 ** 63 - 1, -(2 ** 63)):
        h_int = fmix64(i & ((1 << 64) - 1))
        expected = fmix64((h_int * 31 + h_str) & ((1 << 64) - 1)) % 128
        assert key_group_of((i, "hello")) == expected
        assert int(key_groups_of_array(pa.array([i], pa.int64()), pa.array(["hello"]))[0]) == expected


# ---------------------------------------------------------------------------
# Nulls
# ---------------------------------------------------------------------------

def test_null_keys_raise_type_error():
    with pytest.raises(TypeError):
        key_group_of(None)
    with pytest.raises(TypeError):
        key_group_of((1, None))
    with pytest.raises(TypeError):
        key_group_of(())
    with pytest.raises(TypeError):
        key_groups_of_array(pa.array([1, None, 3], type=pa.int64()))
    with pytest.raises(TypeError):
        key_groups_of_array(pa.array(["a", None]))
    with pytest.raises(TypeError):
        key_groups_of_array(pa.array([1, 2]), pa.array(["a", None]))
    with pytest.raises(TypeError):
        key_groups_of_array(pa.array(["a", None]).dictionary_encode())
    with pytest.raises(TypeError):
        key_groups_of_array(pa.chunked_array([pa.array([1]), pa.array([None], pa.int64())]))


# ---------------------------------------------------------------------------
# Assignment of key groups to subtasks
# ---------------------------------------------------------------------------

def _check_ranges(parallelism, max_parallelism):
    ranges = [key_group_range(s, parallelism, max_parallelism) for s in range(parallelism)]
    # contiguous, non-empty, in order, covering 0..max_parallelism-1 exactly once
    flat = [g for r in ranges for g in r]
    assert flat == list(range(max_parallelism))
    for r in ranges:
        assert len(r) >= 1 and r.step == 1
    # balanced: sizes differ by at most one
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1
    # consistent with subtask_for_key_group, scalar and vectorized
    owner = np.array([subtask_for_key_group(g, parallelism, max_parallelism)
                      for g in range(max_parallelism)])
    expected = np.repeat(np.arange(parallelism), sizes)
    np.testing.assert_array_equal(owner, expected)
    np.testing.assert_array_equal(
        subtask_for_key_group(np.arange(max_parallelism), parallelism, max_parallelism), expected)


@pytest.mark.parametrize("parallelism,max_parallelism", [
    (1, 1), (1, 128), (2, 128), (3, 128), (5, 128), (7, 10), (127, 128), (128, 128),
    (3, 4), (10, 32768), (96, 100)])
def test_key_group_ranges_partition(parallelism, max_parallelism):
    _check_ranges(parallelism, max_parallelism)


@given(st.integers(1, 600).flatmap(lambda m: st.tuples(st.integers(1, m), st.just(m))))
def test_key_group_ranges_partition_any(case):
    parallelism, max_parallelism = case
    _check_ranges(parallelism, max_parallelism)


def test_public_exports_are_the_same_functions():
    assert rs.key_group_of is key_group_of
    assert rs.key_group_range is key_group_range
    assert rs.subtask_for_key_group is subtask_for_key_group
