"""Session windows of built-in aggregates, columnar: no Python per session or record.

The open sessions of a window operator live in one :class:`SessionStore`:
flat arrays of key id, start, end and the aggregates' partial columns (one
entry per open session, in no particular order). A batch merges in with a
few sorts:

1. its rows become sessions ``[ts, ts + gap)``, sorted by (key, start), and
   consecutive ones that intersect are grouped (:func:`session_breaks`); one
   pyarrow ``group_by`` turns each group into partials;
2. the open sessions of the batch's keys join those groups, are sorted by
   (key, start) again and grouped the same way: a group is one merged session,
   its partials merged with ``reduceat`` (or ``merge_partials`` for the
   picking aggregates).

Two sessions intersect when ``start <= other.end and end >= other.start``
(Flink's ``TimeWindow.intersects``): sessions that touch merge.

A row whose own window ``[ts, ts + gap)`` is late is not late yet: it is late
only when the session it would merge into is (:func:`late_for_sessions`, shared
by every session layout and the session joins).

A session that grows or merges keeps its old timers: when one fires, the
operator finds the session's end moved (or the session gone) and ignores it.
The timers of the sessions of the last ``gap`` of event time are all the
stale ones the heap can hold, and no timer is deleted one at a time.

    >>> from raystream.engine.windows.aggregates import AggregateSpec
    >>> store = SessionStore(AggregateSpec.of({"n": ("count", None)}))
    >>> ids = store.add(np.array([1, 1]), np.array([0, 30]), np.array([10, 40]),
    ...                 {"__n.n": np.array([2, 1])})
    >>> ids = store.add(np.array([1]), np.array([10]), np.array([30]), {"__n.n": np.array([5])})
    >>> store.starts.tolist(), store.ends.tolist(), store.partials["__n.n"].tolist()
    ([0], [40], [8])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from raystream.engine.windows.aggregates import AggregateSpec

_REDUCE = {"sum": np.add, "min": np.minimum, "max": np.maximum}


def session_breaks(kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For sessions sorted by (key id, start): True where a session starts a new merged
    session (a new key, or a start after every end before it of its key).

        >>> session_breaks(np.array([1, 1, 1, 2]), np.array([0, 5, 30, 31]),
        ...                np.array([20, 8, 40, 35])).tolist()
        [True, False, True, True]
    """
    n = len(kids)
    breaks = np.ones(n, dtype=bool)
    if n < 2:
        return breaks
    new_key = kids[1:] != kids[:-1]
    if bool(np.all(new_key | (ends[1:] >= ends[:-1]))):  # no session holds the next one
        breaks[1:] = new_key | (starts[1:] > ends[:-1])
        return breaks
    # a running maximum of the ends that restarts at each key: the ends' ranks among all
    # times, offset by the key's rank so that an earlier key's maximum is always smaller
    times = np.unique(np.concatenate([starts, ends]))
    key_rank = np.cumsum(np.concatenate([[0], new_key]))
    offset = key_rank * len(times)
    reach = np.maximum.accumulate(offset + np.searchsorted(times, ends))
    breaks[1:] = offset[1:] + np.searchsorted(times, starts[1:]) > reach[:-1]
    return breaks


def session_at_or_before(s_keys: np.ndarray, s_starts: np.ndarray, keys: np.ndarray,
                         times: np.ndarray) -> np.ndarray:
    """For sessions sorted by (key, start) and queries (key, time): the index of the last
    session that sorts at or before each query, -1 where none does. When the query's key
    has a session starting at or before its time, that is its key's last such session;
    otherwise it is an earlier key's (or -1): callers check the key where it may differ.

        >>> session_at_or_before(np.array([0, 0, 1]), np.array([0, 50, 7]),
        ...                      np.array([1, 0, 0, 1]), np.array([9, 60, 3, 5])).tolist()
        [2, 1, 0, 1]
    """
    n = len(s_keys)
    kind = np.concatenate([np.zeros(n, np.int8), np.ones(len(times), np.int8)])
    order = np.lexsort((kind, np.concatenate([s_starts, times]),
                        np.concatenate([s_keys, keys])))
    marks = np.where(order < n, order, -1)
    carried = np.maximum.accumulate(marks) if len(marks) else marks  # sorted: indices grow
    out = np.empty(len(times), np.int64)
    asked = order >= n
    out[order[asked] - n] = carried[asked]
    return out


@dataclass(frozen=True)
class Windows:
    """Windows ``[starts, ends)`` of key ids ``kids``, aligned (a key's open sessions, or
    the buffered rows' own windows of a session join)."""

    kids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def late_for_sessions(kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                      late: np.ndarray, held: Callable[[np.ndarray], Windows],
                      watermarks: Callable[[np.ndarray], np.ndarray | int],
                      lateness: int) -> np.ndarray:
    """Which of a batch's session rows (windows ``[starts, ends)`` of ``kids``, those whose
    own window is late flagged in ``late``) are late: those whose own window is late and
    intersects none of its key's sessions that are not late (``end - 1 + lateness >
    watermark``) once the batch's other rows merged. ``held(keys)``: the windows the keys
    hold already; ``watermarks(kids)``: the watermark judging each key.

    The batch's rows whose own window is not late merge with the held ones first; the
    late rows are judged against the result, all at once. The order of the rows within
    the batch does not matter: a late row's window ends at or before ``watermark + 1 -
    lateness`` and every session that is not late ends after it, so of a key's disjoint
    sessions only its earliest one that is not late can reach back to a late row; a late
    row joins at most that one, never bridges two, never moves its end (it may move its
    start earlier), and two late rows meet only through it.

        >>> held = lambda keys: Windows(np.array([7]), np.array([0]), np.array([34]))
        >>> late_for_sessions(np.array([7, 7, 7]), np.array([5, -20, 40]),
        ...                   np.array([15, -10, 50]), np.array([True, True, False]), held,
        ...                   lambda kids: 20, 0).tolist()
        [False, True, False]
    """
    at = np.flatnonzero(late)
    if not len(at):
        return late
    late_kids = kids[at]
    keys = np.unique(late_kids)
    stored = held(keys)
    mine = np.isin(stored.kids, keys)
    joined = ~late & np.isin(kids, keys)
    k = np.concatenate([stored.kids[mine], kids[joined]])
    s = np.concatenate([stored.starts[mine], starts[joined]])
    e = np.concatenate([stored.ends[mine], ends[joined]])
    order = np.lexsort((s, k))
    k, s, e = k[order], s[order], e[order]
    firsts = np.flatnonzero(session_breaks(k, s, e))
    if len(firsts):
        k, s, e = k[firsts], s[firsts], np.maximum.reduceat(e, firsts)
    is_open = e - 1 + lateness > watermarks(k)
    k, s, e = k[is_open], s[is_open], e[is_open]
    # the key's last open session starting at or before the row's end: the only one that
    # can intersect it (touching counts)
    found = session_at_or_before(k, s, late_kids, ends[at])
    hit = found >= 0
    hit[hit] = (k[found[hit]] == late_kids[hit]) & (e[found[hit]] >= starts[at][hit])
    still = late.copy()
    still[at[hit]] = False
    return still


@dataclass(frozen=True)
class Merged:
    """Where :meth:`SessionStore.add` left the sessions it made: store indices of the
    sessions with a new (start, end) (their timers are to be registered) and of every
    session that took in new rows (a late one fires again)."""

    changed: np.ndarray
    received: np.ndarray


class SessionStore:
    """The open sessions: ``kids``, ``starts``, ``ends`` and ``partials`` (name -> array),
    aligned. Arrays are replaced, never written in place, so a snapshot may keep them."""

    def __init__(self, spec: AggregateSpec) -> None:
        self.spec = spec
        self.kids = np.empty(0, dtype=np.int64)
        self.starts = np.empty(0, dtype=np.int64)
        self.ends = np.empty(0, dtype=np.int64)
        self.partials: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.kids)

    def add(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            partials: dict[str, np.ndarray]) -> Merged:
        """Merge sessions ``[starts, ends)`` of ``kids`` with their partials into the store:
        every stored session of those keys and the new ones, sorted and grouped where they
        intersect, become the merged sessions."""
        touched = np.isin(self.kids, kids) if len(self.kids) else np.zeros(0, dtype=bool)
        old = np.flatnonzero(touched)
        k = np.concatenate([self.kids[old], kids])
        s = np.concatenate([self.starts[old], starts])
        e = np.concatenate([self.ends[old], ends])
        is_old = np.arange(len(k)) < len(old)
        p = {name: np.concatenate([self.partials[name][old], values]) if self.partials
             else values for name, values in partials.items()}
        order = np.lexsort((s, k))
        k, s, e, is_old = k[order], s[order], e[order], is_old[order]
        breaks = session_breaks(k, s, e)
        firsts = np.flatnonzero(breaks)
        session = np.cumsum(breaks) - 1
        merged_end = np.maximum.reduceat(e, firsts)
        merged = self._merge_partials({name: v[order] for name, v in p.items()}, firsts, session)
        # a session whose (start, end) one of its old sessions had keeps that one's timers
        kept = np.zeros(len(firsts), dtype=bool)
        kept[session[is_old & (s == s[firsts][session]) & (e == merged_end[session])]] = True
        received = np.zeros(len(firsts), dtype=bool)
        received[session[~is_old]] = True
        stay = np.flatnonzero(~touched) if len(old) else slice(None)
        base = len(self.kids) - len(old)
        self.kids = np.concatenate([self.kids[stay], k[firsts]])
        self.starts = np.concatenate([self.starts[stay], s[firsts]])
        self.ends = np.concatenate([self.ends[stay], merged_end])
        self.partials = {name: np.concatenate([self.partials[name][stay], merged[name]])
                         if self.partials else merged[name] for name in merged}
        return Merged(changed=base + np.flatnonzero(~kept), received=base + np.flatnonzero(received))

    def _merge_partials(self, partials: dict[str, np.ndarray], firsts: np.ndarray,
                        session: np.ndarray) -> dict[str, np.ndarray]:
        """Each merged session's partials: rows ``firsts[i]:firsts[i+1]`` of ``partials``."""
        spec = self.spec
        if not spec.picking:
            return {name: _REDUCE[spec.merges[name]].reduceat(values, firsts)
                    for name, values in partials.items()}
        table = pa.table({"__session": session, **partials})
        out = spec.merge_partials(table, ["__session"])
        order = np.argsort(out["__session"].to_numpy())
        return {name: out[name].to_numpy()[order] for name in partials}

    def windows_of(self, keys: np.ndarray) -> Windows:
        """The open sessions of the key ids ``keys``."""
        mine = np.isin(self.kids, keys)
        return Windows(self.kids[mine], self.starts[mine], self.ends[mine])

    def find(self, kids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The store index of each (key id, start) session, -1 where there is none."""
        n = len(self.kids)
        k = np.concatenate([self.kids, kids])
        s = np.concatenate([self.starts, starts])
        asked = np.arange(len(k)) >= n
        order = np.lexsort((asked, s, k))  # a stored session sorts before the questions
        k, s = k[order], s[order]
        first = np.ones(len(k), dtype=bool)
        first[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
        # each position's run of equal (key, start): its first position holds the answer
        head = np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
        answer = order[head]
        found = np.where(answer < n, answer, -1)
        result = np.empty(len(kids), dtype=np.int64)
        result[order[asked[order]] - n] = found[asked[order]]
        return result

    def remove(self, indices: np.ndarray) -> None:
        if not len(indices):
            return
        keep = np.ones(len(self.kids), dtype=bool)
        keep[indices] = False
        self.kids, self.starts, self.ends = self.kids[keep], self.starts[keep], self.ends[keep]
        self.partials = {name: values[keep] for name, values in self.partials.items()}

    def extend(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               partials: dict[str, np.ndarray]) -> None:
        """Append sessions as they are (restored ones: disjoint from the stored)."""
        self.kids = np.concatenate([self.kids, kids])
        self.starts = np.concatenate([self.starts, starts])
        self.ends = np.concatenate([self.ends, ends])
        self.partials = {name: np.concatenate([self.partials[name], values]) if self.partials
                         else values for name, values in partials.items()}

    def results(self, indices: np.ndarray) -> dict[str, pa.Array]:
        """The aggregates' output columns of the sessions at ``indices``."""
        return self.spec.results({name: values[indices] for name, values in self.partials.items()})
