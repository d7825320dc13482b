"""A deduplicating min-heap of timers on flat numpy arrays (Flink ``HeapPriorityQueueSet``).

A timer is ``(timestamp, key_id, namespace)``, three int64s, ordered
lexicographically; the heap holds each timer at most once.

Layout
------
* The heap: a 4-ary min-heap (children of position p at 4p+1..4p+4: half
  the depth of a binary heap, so fewer Python-level steps per sift and fewer
  vectorized rounds) over three int64 columns (timestamp, key id, namespace)
  plus an int32 column holding, for every heap position, the timer's slot in
  the index. 28 bytes per timer, no Python object per timer. A snapshot is a
  plain copy of the three columns.
* The index (position lookup for dedup and O(log n) delete): an
  open-addressing hash table, one int32 per slot holding the timer's heap
  position (``-1`` empty, ``-2`` deleted), linear probing, kept at most 3/4
  full (live + deleted) and rebuilt to 3/5 full (so 10,000,000 timers take
  2**24 slots, 64 MiB). The timers are not stored twice: a probe compares
  against the heap columns at the stored position. The per-position back
  pointer lets a sift move a timer with one int32 write to the index, no
  hashing. At 10,000,000 timers heap + index take about 330 MiB (a dict of
  tuples would take about 2.5 GB).

Speed
-----
Single operations (``add``, ``remove``, popping a few timers) run in Python on
``memoryview``s of the arrays (reading a memoryview item gives a plain Python
int, several times cheaper than indexing numpy); a removal moves the hole
down to a leaf along the smallest children, then sifts the last timer up from
there, as ``heapq`` does. Bulk operations are vectorized: ``add_many``
appends the batch, inserts it into the index with vectorized probing rounds
(which also drop duplicates) and restores the heap with a level-synchronous
Floyd heapify of the dirty positions (the appended ones and their ancestors:
nodes on one tree level have disjoint subtrees, so a level is sifted down in
lock step); ``pop_until`` finds the due timers with a vectorized
breadth-first walk from the root (they form a subtree containing it), fills
their holes with the heap's tail and heapifies the holes the same way. Both
cost O(batch) numpy work plus O(depth^2) numpy calls, never a sort of the
whole heap (a full-heap ``np.lexsort`` is slower than the Floyd heapify).

Example:
    >>> import numpy as np
    >>> heap = TimerHeap()
    >>> heap.add(20, 1, 0), heap.add(10, 2, 0), heap.add(10, 2, 0)
    (True, True, False)
    >>> heap.add_many(np.array([30, 5]), np.array([1, 1]), np.array([0, 0]))
    2
    >>> heap.peek()
    (5, 1, 0)
    >>> heap.remove(20, 1, 0)
    True
    >>> ts, key_ids, namespaces = heap.pop_until(10)
    >>> ts.tolist(), key_ids.tolist(), len(heap)
    ([5, 10], [1, 2], 1)
"""

from __future__ import annotations

import operator
from typing import Iterable

import numpy as np

__all__ = ["TimerHeap"]

_EMPTY = -1  # index slot never used since the last rebuild
_DELETED = -2  # index slot whose timer was removed (probes continue past it)
# Linear probing: a vectorized insertion runs as many rounds as its *longest* probe
# chain, so the index is kept sparse (at 10M timers: 160 MiB of int32 slots).
_MAX_LOAD = 0.5  # (live + deleted) / slots before the index is rebuilt
_TARGET_LOAD = 0.25  # live / slots right after a rebuild
_SCALAR_TAIL = 16  # pending insertions finished one by one in Python (long chains)
_MAX_TIMERS = 2**31 - 1  # positions and slots are int32

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_M64 = 2**64 - 1
# Hash of a timer: a linear mix of its three fields, then a murmur-style finalizer.
# The Python (single timer) and numpy (vectorized) versions must agree bit for bit.
_H1 = 0x9E3779B97F4A7C15
_H2 = 0xC2B2AE3D27D4EB4F
_H3 = 0x165667B19E3779F9
_H4 = 0xFF51AFD7ED558CCD
_U_H1, _U_H2, _U_H3, _U_H4 = (np.uint64(c) for c in (_H1, _H2, _H3, _H4))
_U32, _U29 = np.uint64(32), np.uint64(29)


def _hash_py(t: int, k: int, s: int) -> int:
    h = (t * _H1 + k * _H2 + s * _H3) & _M64
    h ^= h >> 32
    h = (h * _H4) & _M64
    return h ^ (h >> 29)


def _hash_np(t: np.ndarray, k: np.ndarray, s: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = t.view(np.uint64) * _U_H1
        tmp = np.multiply(k.view(np.uint64), _U_H2)
        h += tmp
        np.multiply(s.view(np.uint64), _U_H3, out=tmp)
        h += tmp
        np.right_shift(h, _U32, out=tmp)
        h ^= tmp
        h *= _U_H4
        np.right_shift(h, _U29, out=tmp)
        h ^= tmp
    return h


def _table_size_for(live: int) -> int:
    size = 16
    while size * _TARGET_LOAD < live:
        size *= 2
    if size > 2**31:
        raise OverflowError(f"a timer heap holds at most {_MAX_TIMERS} timers")
    return size


def _depth(p: int) -> int:
    """Tree level of heap position ``p`` (level d starts at (4**d - 1) // 3)."""
    return ((3 * p + 1).bit_length() - 1) // 2


def _level_start(d: int) -> int:
    return (4**d - 1) // 3


def _as_int64(name: str, values: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype != np.int64:
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
        if arr.dtype == np.uint64 and arr.size and int(arr.max()) > _INT64_MAX:
            raise OverflowError(f"{name} holds a value above the int64 range")
        arr = arr.astype(np.int64)
    return arr


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))


class TimerHeap:
    """Min-heap of timers ``(timestamp, key_id, namespace)`` (int64 each), deduplicated
    on all three, on flat numpy arrays with a hash index for O(log n) delete.

    Timers come out ordered by timestamp, then key id, then namespace. Not
    thread-safe: one thread changes a heap (:meth:`arrays` copies are then safe
    to hand to another thread).

    Example:
        >>> import numpy as np
        >>> heap = TimerHeap()
        >>> heap.add(1000, 7, 0)
        True
        >>> heap.add(1000, 7, 0)  # already there
        False
        >>> heap.add_many(np.array([999, 1000, 2000]), np.array([3, 7, 3]), np.zeros(3, np.int64))
        2
        >>> len(heap), heap.peek()
        (3, (999, 3, 0))
        >>> heap.remove(2000, 3, 0), heap.remove(2000, 3, 0)
        (True, False)
        >>> [a.tolist() for a in heap.pop_until(1000)]
        [[999, 1000], [3, 7], [0, 0]]
        >>> len(heap)
        0
    """

    # Below these sizes the per-timer Python path beats the vectorized one, whose
    # fixed cost is O(depth^2) numpy calls, about a millisecond at 1M timers
    # (measured crossovers: ~500 timers for add_many, ~200 for pop_until).
    small_batch = 512  # add_many of at most this many timers adds them one by one
    small_pop = 64  # pop_until pops this many one by one before counting the rest
    small_pop_rest = 128  # ... and keeps popping one by one if at most this many remain
    insert_chunk = 1 << 20  # timers per vectorized index-insertion chunk

    def __init__(self, capacity: int = 1024) -> None:
        capacity = max(int(capacity), 16)
        self._n = 0
        self._alloc_heap(capacity)
        self._alloc_table(_table_size_for(min(capacity, 1024)))

    # -- storage ------------------------------------------------------------
    def _alloc_heap(self, capacity: int) -> None:
        if capacity > _MAX_TIMERS:
            raise OverflowError(f"a timer heap holds at most {_MAX_TIMERS} timers")
        n = self._n
        ts = np.empty(capacity, np.int64)
        kid = np.empty(capacity, np.int64)
        ns = np.empty(capacity, np.int64)
        slot = np.empty(capacity, np.int32)
        if n:
            ts[:n] = self._ts[:n]
            kid[:n] = self._kid[:n]
            ns[:n] = self._ns[:n]
            slot[:n] = self._slot[:n]
        self._ts, self._kid, self._ns, self._slot = ts, kid, ns, slot
        self._cap = capacity
        # memoryviews (an array's data) give the Python paths plain-int item access
        self._mts, self._mkid, self._mns, self._mslot = ts.data, kid.data, ns.data, slot.data

    def _ensure_capacity(self, needed: int) -> None:
        if needed > self._cap:
            self._alloc_heap(max(needed, self._cap + self._cap // 2))

    def _alloc_table(self, size: int) -> None:
        self._table = np.full(size, _EMPTY, np.int32)
        self._mtable = self._table.data
        self._mask = size - 1
        self._used = 0  # live + deleted slots
        self._limit = int(size * _MAX_LOAD)

    def _rebuild_table(self, live: int) -> None:
        """A fresh index sized for ``live`` timers, holding the current heap."""
        self._alloc_table(_table_size_for(live))
        n = self._n
        if n:
            added, slots = self._index_insert(0, n)
            assert added.all(), "heap held a duplicate timer"
            self._slot[:n] = slots

    # -- the index ----------------------------------------------------------
    def _find(self, t: int, k: int, s: int) -> tuple[int, int]:
        """(slot, position) of a present timer, else (-1, slot to insert at)."""
        T, K, N, TB = self._mts, self._mkid, self._mns, self._mtable
        mask = self._mask
        i = _hash_py(t, k, s) & mask
        deleted = -1
        while True:
            p = TB[i]
            if p >= 0:
                if T[p] == t and K[p] == k and N[p] == s:
                    return i, p
            elif p == _EMPTY:
                return -1, (i if deleted < 0 else deleted)
            elif deleted < 0:
                deleted = i
            i = (i + 1) & mask

    def _index_insert(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Insert the timers at heap positions [lo, hi) into the index, vectorized.

        Returns (added mask, slot of each added timer); a timer equal to one
        already indexed (or to another of the same call) is not added. Works in
        chunks (a later chunk sees the earlier ones in the index), which bounds
        the temporary memory and keeps it in cache.
        """
        added = np.zeros(hi - lo, bool)
        where = np.empty(hi - lo, np.int64)
        chunk = self.insert_chunk
        for start in range(lo, hi, chunk):
            end = min(hi, start + chunk)
            self._index_insert_chunk(start, end, added[start - lo:end - lo],
                                     where[start - lo:end - lo])
        self._used += int(np.count_nonzero(added))
        return added, where[added]

    def _index_insert_chunk(self, lo: int, hi: int, added: np.ndarray, where: np.ndarray) -> None:
        """Every probing round looks at one slot per pending timer: an empty slot
        is claimed (of several claimants one wins, the others then treat the slot
        as taken by the winner), a slot holding an equal timer marks a duplicate,
        any other advances the probe."""
        T, K, N, table = self._ts, self._kid, self._ns, self._table
        mask = np.int64(self._mask)
        t, k, s = T[lo:hi], K[lo:hi], N[lo:hi]
        h = _hash_np(t, k, s)
        h &= np.uint64(self._mask)
        slot = h.view(np.int64)
        pending = None  # None: all of them (first round, spares a gather)
        while pending is None or pending.size:
            ps = slot if pending is None else slot[pending]
            occupant = table[ps]
            finished = np.zeros(len(ps), bool)
            advance = occupant == _DELETED
            empty = np.flatnonzero(occupant == _EMPTY)
            if empty.size:
                claimants = empty if pending is None else pending[empty]
                cs = ps[empty]
                claim = (claimants + lo).astype(np.int32)
                table[cs] = claim
                won = table[cs] == claim
                winners = claimants[won]
                added[winners] = True
                where[winners] = cs[won]
                finished[empty[won]] = True
                # a losing claimant compares with the winner at once (dup or advance)
                lost = np.flatnonzero(~won)
                if lost.size:
                    occupant[empty[lost]] = table[cs[lost]]
            live = np.flatnonzero(occupant >= 0)
            if live.size:
                li = live if pending is None else pending[live]
                op = occupant[live]
                # compare key id and namespace only where the timestamps match
                same = np.flatnonzero(T[op] == t[li])
                if same.size:
                    op2, li2 = op[same], li[same]
                    dup = (K[op2] == k[li2]) & (N[op2] == s[li2])
                    finished[live[same[dup]]] = True
                    advance[live] = True
                    advance[live[same[dup]]] = False
                else:
                    advance[live] = True
            moving = np.flatnonzero(advance)
            if pending is not None:
                moving = pending[moving]
            slot[moving] = (slot[moving] + 1) & mask
            pending = np.flatnonzero(~finished) if pending is None else pending[~finished]
            if 0 < pending.size <= _SCALAR_TAIL:  # a few long chains: cheaper one by one
                self._index_insert_scalar(lo, pending, slot, added, where)
                return

    def _index_insert_scalar(self, lo: int, pending: np.ndarray, slot: np.ndarray,
                             added: np.ndarray, where: np.ndarray) -> None:
        """Finish the insertions of ``pending`` (positions ``lo + j``) from their
        current probe slots, with the same rules as the vectorized rounds."""
        T, K, N, TB = self._mts, self._mkid, self._mns, self._mtable
        mask = self._mask
        for j in pending.tolist():
            pos, i = lo + j, int(slot[j])
            t, k, s = T[pos], K[pos], N[pos]
            while True:
                p = TB[i]
                if p == _EMPTY:
                    TB[i] = pos
                    added[j] = True
                    where[j] = i
                    break
                if p >= 0 and T[p] == t and K[p] == k and N[p] == s:
                    break  # a duplicate
                i = (i + 1) & mask

    # -- Python-path sifts ----------------------------------------------------
    def _sift_up(self, pos: int, t: int, k: int, s: int, sl: int) -> None:
        T, K, N, SL, TB = self._mts, self._mkid, self._mns, self._mslot, self._mtable
        while pos > 0:
            parent = (pos - 1) >> 2
            tp = T[parent]
            if tp < t:
                break
            if tp == t:
                kp = K[parent]
                if kp < k or (kp == k and N[parent] < s):
                    break
            T[pos] = tp
            K[pos] = K[parent]
            N[pos] = N[parent]
            x = SL[parent]
            SL[pos] = x
            TB[x] = pos
            pos = parent
        T[pos] = t
        K[pos] = k
        N[pos] = s
        SL[pos] = sl
        TB[sl] = pos

    def _fill_hole(self, pos: int, t: int, k: int, s: int, sl: int) -> None:
        """Place a timer into a hole at ``pos`` (``pos < len``): move the hole down to
        a leaf along the smallest children, then sift the timer up (``heapq``)."""
        T, K, N, SL, TB = self._mts, self._mkid, self._mns, self._mslot, self._mtable
        n = self._n
        c = 4 * pos + 1
        while c < n:
            best = c
            tb = T[c]
            end = c + 4 if c + 4 <= n else n
            j = c + 1
            while j < end:
                tj = T[j]
                if tj < tb or (tj == tb and (K[j] < K[best] or (K[j] == K[best] and N[j] < N[best]))):
                    best = j
                    tb = tj
                j += 1
            T[pos] = tb
            K[pos] = K[best]
            N[pos] = N[best]
            x = SL[best]
            SL[pos] = x
            TB[x] = pos
            pos = best
            c = 4 * pos + 1
        self._sift_up(pos, t, k, s, sl)

    # -- vectorized heapify -------------------------------------------------
    def _less(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise: timer at position a < timer at position b."""
        T = self._ts
        ta, tb = T[a], T[b]
        lt = ta < tb
        tie = np.flatnonzero(ta == tb)
        if tie.size:
            a2, b2 = a[tie], b[tie]
            ka, kb = self._kid[a2], self._kid[b2]
            lt2 = ka < kb
            tie2 = np.flatnonzero(ka == kb)
            if tie2.size:
                lt2[tie2] = self._ns[a2[tie2]] < self._ns[b2[tie2]]
            lt[tie] = lt2
        return lt

    def _sift_down_many(self, nodes: np.ndarray) -> None:
        """Sift down all ``nodes`` (same tree level, so disjoint subtrees, each
        child subtree a heap) in lock step, keeping the index up to date."""
        n = self._n
        moved: list[np.ndarray] = []
        cols = (self._ts, self._kid, self._ns, self._slot)
        cur = nodes
        while cur.size:
            first = 4 * cur + 1
            inside = first < n
            if not inside.all():
                cur, first = cur[inside], first[inside]
                if not cur.size:
                    break
            best = first.copy()
            for j in (1, 2, 3):  # smallest child
                has = np.flatnonzero(first + j < n)
                if not has.size:
                    break
                candidate = first[has] + j
                better = self._less(candidate, best[has])
                best[has[better]] = candidate[better]
            swap = self._less(best, cur)
            cur, best = cur[swap], best[swap]
            if not cur.size:
                break
            for col in cols:
                upper = col[cur]
                col[cur] = col[best]
                col[best] = upper
            moved.append(cur)
            moved.append(best)
            cur = best
        if moved:
            positions = np.concatenate(moved)
            self._table[self._slot[positions]] = positions

    def _heapify_levels(self, levels: list[np.ndarray]) -> None:
        """Floyd heapify of dirty positions given per tree level, deepest level first;
        the dirty set must contain every ancestor of its members."""
        last_parent = (self._n - 2) // 4
        for nodes in levels:
            if nodes.size and nodes[0] <= last_parent:
                self._sift_down_many(nodes[nodes <= last_parent])

    def _heapify_after_append(self, lo: int, hi: int) -> None:
        """Restore the heap after appending positions [lo, hi) to a valid heap [0, lo)."""
        per_depth: dict[int, list[tuple[int, int]]] = {}
        p = lo
        while p < hi:  # split [lo, hi) by tree level; ancestors of a level run are runs
            d = _depth(p)
            end = min(hi, _level_start(d + 1))
            a, b = p, end - 1
            for e in range(d, -1, -1):
                per_depth.setdefault(e, []).append((a, b))
                a, b = (a - 1) >> 2, (b - 1) >> 2
            p = end
        levels = []
        for d in sorted(per_depth, reverse=True):
            runs = sorted(per_depth[d])
            merged = [list(runs[0])]
            for a, b in runs[1:]:
                if a <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            levels.append(np.concatenate(
                [np.arange(a, b + 1, dtype=np.int64) for a, b in merged]))
        self._heapify_levels(levels)

    # -- public API ---------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __contains__(self, timer: tuple[int, int, int]) -> bool:
        t, k, s = map(operator.index, timer)
        return self._find(t, k, s)[0] >= 0

    def __repr__(self) -> str:
        return f"TimerHeap(len={self._n}, next={self.peek()})"

    def add(self, timestamp: int, key_id: int, namespace: int) -> bool:
        """Add a timer; False (and no change) if it is already present."""
        t = operator.index(timestamp)
        k = operator.index(key_id)
        s = operator.index(namespace)
        if not (_INT64_MIN <= t <= _INT64_MAX and _INT64_MIN <= k <= _INT64_MAX
                and _INT64_MIN <= s <= _INT64_MAX):
            raise OverflowError(f"timer ({t}, {k}, {s}) does not fit int64")
        found, slot = self._find(t, k, s)
        if found >= 0:
            return False
        if self._mtable[slot] == _EMPTY:
            if self._used + 1 > self._limit:
                self._rebuild_table(self._n + 1)
                slot = self._find(t, k, s)[1]
            if self._mtable[slot] == _EMPTY:
                self._used += 1
        n = self._n
        if n == self._cap:
            self._ensure_capacity(n + 1)
        self._n = n + 1
        self._sift_up(n, t, k, s, slot)
        return True

    def add_many(self, timestamps: np.ndarray, key_ids: np.ndarray,
                 namespaces: np.ndarray) -> int:
        """Add a batch of timers (vectorized); duplicates, within the batch or of timers
        already present, are skipped. Returns how many were added."""
        ts = _as_int64("timestamps", timestamps)
        kid = _as_int64("key_ids", key_ids)
        ns = _as_int64("namespaces", namespaces)
        m = len(ts)
        if len(kid) != m or len(ns) != m:
            raise ValueError(
                f"timestamps, key_ids and namespaces differ in length: {m}, {len(kid)}, {len(ns)}")
        if m <= self.small_batch:
            add = self.add
            return sum(map(add, ts.tolist(), kid.tolist(), ns.tolist()))
        n = self._n
        if self._used + m > self._limit:
            self._rebuild_table(n + m)
        self._ensure_capacity(n + m)
        # Stage the batch after the heap, index it (dropping duplicates), compact.
        self._ts[n:n + m] = ts
        self._kid[n:n + m] = kid
        self._ns[n:n + m] = ns
        added, slots = self._index_insert(n, n + m)
        a = len(slots)
        if a < m:
            keep = np.flatnonzero(added)
            for col in (self._ts, self._kid, self._ns):
                col[n:n + a] = col[n + keep]
            self._table[slots] = np.arange(n, n + a, dtype=np.int32)
        self._slot[n:n + a] = slots
        self._n = n + a
        if a:
            self._heapify_after_append(n, n + a)
        return a

    def remove(self, timestamp: int, key_id: int, namespace: int) -> bool:
        """Remove a timer in O(log n); False if it is not present."""
        t = operator.index(timestamp)
        k = operator.index(key_id)
        s = operator.index(namespace)
        slot, pos = self._find(t, k, s)
        if slot < 0:
            return False
        self._mtable[slot] = _DELETED
        n = self._n - 1
        self._n = n
        if pos != n:
            self._fill_hole(pos, self._mts[n], self._mkid[n], self._mns[n], self._mslot[n])
        return True

    def peek(self) -> tuple[int, int, int] | None:
        """The first timer, or None if the heap is empty."""
        if not self._n:
            return None
        return self._mts[0], self._mkid[0], self._mns[0]

    def pop_until(self, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove and return every timer with ``timestamp <= bound`` as (timestamps,
        key_ids, namespaces) ordered by (timestamp, key_id, namespace).

        Pops one by one (O(log n) each) while few are due; when more than
        ``small_pop`` are, it counts the rest with a vectorized walk from the
        root and, if many, removes them all at once.
        """
        if bound >= _INT64_MAX:
            bound = _INT64_MAX
        elif bound < _INT64_MIN:
            return _empty()
        bound = int(bound)
        if not self._n or self._mts[0] > bound:
            return _empty()
        head: tuple[list[int], list[int], list[int]] = ([], [], [])
        if self._pop_python(bound, self.small_pop, head):
            return tuple(np.array(col, np.int64) for col in head)  # type: ignore[return-value]
        levels = self._due_levels(bound)
        due = sum(map(len, levels))
        if due <= self.small_pop_rest:
            self._pop_python(bound, due, head)
            return tuple(np.array(col, np.int64) for col in head)  # type: ignore[return-value]
        rest = self._pop_levels(levels)
        return tuple(np.concatenate([np.array(h, np.int64), r])  # type: ignore[return-value]
                     for h, r in zip(head, rest))

    def _pop_python(self, bound: int, limit: int,
                    out: tuple[list[int], list[int], list[int]]) -> bool:
        """Pop up to ``limit`` due timers into ``out``; True when none is due any more."""
        T, K, N, SL, TB = self._mts, self._mkid, self._mns, self._mslot, self._mtable
        out_t, out_k, out_s = out
        n = self._n
        for _ in range(limit):
            if not n or T[0] > bound:
                return True
            out_t.append(T[0])
            out_k.append(K[0])
            out_s.append(N[0])
            TB[SL[0]] = _DELETED
            n -= 1
            self._n = n
            if n:
                self._fill_hole(0, T[n], K[n], N[n], SL[n])
        return not n or T[0] > bound

    def _due_levels(self, bound: int) -> list[np.ndarray]:
        """Positions of the due timers per tree level, root first: they form a subtree
        containing the root, found with a vectorized breadth-first walk."""
        n = self._n
        T = self._ts
        levels: list[np.ndarray] = []
        frontier = np.zeros(1, np.int64) if n and T[0] <= bound else np.empty(0, np.int64)
        while frontier.size:
            levels.append(frontier)
            first = 4 * frontier + 1
            children = np.stack([first, first + 1, first + 2, first + 3], axis=1).ravel()
            children = children[children < n]
            frontier = children[T[children] <= bound]
        return levels

    def _pop_levels(self, levels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the due timers found by :meth:`_due_levels`, vectorized; return them sorted."""
        n = self._n
        T = self._ts
        due = np.concatenate(levels)
        k = len(due)
        order = np.lexsort((self._ns[due], self._kid[due], T[due]))
        due_sorted = due[order]
        result = (T[due_sorted], self._kid[due_sorted], self._ns[due_sorted])
        self._table[self._slot[due]] = _DELETED
        new_n = n - k
        # Fill the holes below new_n with the tail timers that are not due.
        in_tail = np.zeros(k, bool)
        in_tail[due[due >= new_n] - new_n] = True
        tail = new_n + np.flatnonzero(~in_tail)
        hole_levels = [lv[lv < new_n] for lv in levels]
        holes = np.concatenate(hole_levels)
        for col in (self._ts, self._kid, self._ns, self._slot):
            col[holes] = col[tail]
        self._table[self._slot[holes]] = holes
        self._n = new_n
        # Holes are closed under ancestors; heapify them deepest level first.
        self._heapify_levels(hole_levels[::-1])
        if new_n < self._cap // 4 and self._cap > 4096:
            self._alloc_heap(max(1024, 2 * new_n))
        if self._used - new_n > max(new_n, self._limit // 4):  # mostly deleted slots
            self._rebuild_table(new_n)
        return result

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the live (timestamps, key_ids, namespaces), in heap order (not sorted):
        one memcpy each, the synchronous part of a snapshot."""
        n = self._n
        return self._ts[:n].copy(), self._kid[:n].copy(), self._ns[:n].copy()

    @classmethod
    def from_arrays(cls, timestamps: np.ndarray, key_ids: np.ndarray,
                    namespaces: np.ndarray) -> "TimerHeap":
        """A heap holding the given timers (any order; duplicates dropped), built vectorized."""
        heap = cls(capacity=len(timestamps))
        heap.add_many(timestamps, key_ids, namespaces)
        return heap
