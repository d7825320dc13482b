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
