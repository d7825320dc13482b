"""The key table of a timer service: dense int64 *key ids* for the keys of one
operator subtask, so timers are flat int64 arrays rather than Python objects.

It maps key id -> key (a list), key -> key id (a dict) and key id -> key group (an
int16/int32 numpy array). The key-group array grows by allocating a larger one,
never by an in-place resize, so a snapshot holding the old array stays valid while
the processing thread appends. The heap timer service never empties its table; the
disk one empties it at safe points (:mod:`raystream.timers.disk_service`).

Example:
    >>> import numpy as np
    >>> table = KeyTable(max_parallelism=128, key_groups=range(0, 64))
    >>> ids = table.key_ids(["a", "b", "a"], np.array([50, 3, 50]))
    >>> ids.tolist(), table.keys(ids), table.key_groups_of(ids).tolist()
    ([0, 1, 0], ['a', 'b', 'a'], [50, 3, 50])
    >>> table.key_id("c", 95)
    Traceback (most recent call last):
    ValueError: key 'c' is in key group 95, outside this subtask's key groups 0..63
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from raystream.checkpoint.keygroups import check_key_group_range

__all__ = ["KeyTable"]


class KeyTable:
    """Key ids of the keys of one subtask's key groups (see the module docstring)."""

    def __init__(self, *, max_parallelism: int, key_groups: range) -> None:
        check_key_group_range(key_groups, max_parallelism)
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self._kg_dtype = np.int16 if max_parallelism <= 2**15 else np.int32
        self._clear_keys()

    def _clear_keys(self) -> None:
        self._keys: list[Any] = []
        self._ids: dict[Any, int] = {}
        self._kg = np.empty(1024, self._kg_dtype)

    def _check_group(self, key: Any, key_group: int) -> None:
        if key_group not in self.key_groups:
            raise ValueError(
                f"key {key!r} is in key group {key_group}, outside this subtask's key "
                f"groups {self.key_groups.start}..{self.key_groups.stop - 1}")

    def _append_key(self, key: Any, key_group: int) -> int:
        kid = len(self._keys)
        if kid == len(self._kg):
            # A new array, never an in-place resize: snapshots may hold the old one.
            grown = np.empty(2 * kid, self._kg_dtype)
            grown[:kid] = self._kg
            self._kg = grown
        self._kg[kid] = key_group
        self._keys.append(key)
        self._ids[key] = kid
        return kid

    def _mismatch(self, key: Any, kid: int, key_group: int) -> ValueError:
        return ValueError(
            f"key {key!r} was registered in key group {int(self._kg[kid])}, now given key "
            f"group {key_group} (keys that compare equal must hash to the same key group)")

    def key_id(self, key: Any, key_group: int) -> int:
        """The id of ``key`` (whose key group is ``key_group``), appending it if new."""
        kid = self._ids.get(key)
        if kid is None:
            self._check_group(key, key_group)
            return self._append_key(key, key_group)
        if self._kg[kid] != key_group:
            raise self._mismatch(key, kid, key_group)
        return kid

    def key_ids(self, keys: list, key_groups: np.ndarray) -> np.ndarray:
        """Ids of a batch's ``keys`` (with their key groups), appending new ones."""
        key_groups = np.asarray(key_groups)
        if len(key_groups) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(key_groups)} key groups")
        if len(keys) == 0:
            return np.empty(0, np.int64)
        outside = np.flatnonzero((key_groups < self.key_groups.start)
                                 | (key_groups >= self.key_groups.stop))
        if outside.size:
            i = int(outside[0])
            self._check_group(keys[i], int(key_groups[i]))
        get = self._ids.get
        found = list(map(get, keys))
        if None in found:
            known = np.array([i for i, kid in enumerate(found) if kid is not None], np.int64)
            if known.size:  # check before appending anything
                self._check_groups(keys, np.array([found[i] for i in known.tolist()], np.int64),
                                   key_groups[known], known)
            groups = key_groups.tolist()
            for i, kid in enumerate(found):
                if kid is None:
                    kid = get(keys[i])  # the batch may repeat a new key
                    found[i] = kid if kid is not None else self._append_key(keys[i], groups[i])
        ids = np.array(found, np.int64)
        self._check_groups(keys, ids, key_groups, None)
        return ids

    def _check_groups(self, keys: list, ids: np.ndarray, key_groups: np.ndarray,
                      positions: np.ndarray | None) -> None:
        wrong = np.flatnonzero(self._kg[ids] != key_groups)
        if wrong.size:
            i = int(wrong[0])
            key = keys[i if positions is None else int(positions[i])]
            raise self._mismatch(key, int(ids[i]), int(key_groups[i]))

    def key(self, key_id: int) -> Any:
        """The key of ``key_id``."""
        return self._keys[key_id]

    def keys(self, key_ids: np.ndarray) -> list:
        """The keys of ``key_ids``, in order."""
        ids = np.asarray(key_ids).tolist()
        if len(ids) < 2:
            return [self._keys[i] for i in ids]
        return list(operator.itemgetter(*ids)(self._keys))  # one C loop, not a Python one

    def key_group(self, key_id: int) -> int:
        """The key group of ``key_id``."""
        if not 0 <= key_id < len(self._keys):
            raise IndexError(f"no key id {key_id}")
        return int(self._kg[key_id])

    def key_groups_of(self, key_ids: np.ndarray) -> np.ndarray:
        """Key groups (int64) of ``key_ids``, vectorized. Safe on another thread for ids
        that existed when it got them, while the table is not emptied (appending
        replaces the key-group array, never changes it)."""
        key_ids = np.asarray(key_ids)
        n = len(self._keys)
        if key_ids.size and (key_ids.min() < 0 or key_ids.max() >= n):
            raise IndexError(f"key ids out of range: {n} keys known")
        return self._kg[key_ids].astype(np.int64)

    @property
    def num_keys(self) -> int:
        """How many keys the table holds (ids are 0..num_keys-1)."""
        return len(self._keys)

    def _check_key_id(self, key_id: int) -> int:
        key_id = operator.index(key_id)
        if not 0 <= key_id < len(self._keys):
            raise ValueError(f"timer for unknown key id {key_id} ({len(self._keys)} keys known)")
        return key_id

    def _check_key_ids(self, key_ids: np.ndarray) -> np.ndarray:
        key_ids = np.asarray(key_ids, dtype=np.int64)
        n = len(self._keys)
        if key_ids.size and (key_ids.min() < 0 or key_ids.max() >= n):
            bad = key_ids[(key_ids < 0) | (key_ids >= n)][0]
            raise ValueError(f"timer for unknown key id {bad} ({n} keys known)")
        return key_ids
