"""Timer service of a keyed operator on the disk state backend: timers in the
operator instance's RocksDB (Flink's ``RocksDBPriorityQueueSetFactory``,
``KeyGroupPartitionedPriorityQueue``, ``RocksDBCachingPriorityQueueSet``).

A job with ``state_backend="disk"`` keeps its keyed state out of memory; its
timers go with it, so memory stays bounded however many keys hold timers. A
heap job keeps :class:`~raystream.timers.service.TimerService`.

Layout
------
Each timer is one entry, with an empty value, in the disk backend's database::

    key group (uint16) | state id (uint16) | timestamp (uint64) | namespace (uint64) | key

big-endian throughout, timestamp and namespace offset by 2**63 so byte order is
numeric order, the key encoded as the backend encodes keys. The two domains
are two raw states of the backend, ``__timers_event_time`` and
``__timers_processing_time``, both of kind ``"timers"``
(:data:`~raystream.checkpoint.disk_sections.TIMERS_KIND`). A timer is unique on
(timestamp, key, namespace) for free: registering it again writes the same
entry. Registration of a batch is one write batch.

Every key group's timers of a domain are one key range in timestamp order, so
firing is one bounded range read per key group holding a due timer, from that
key group's earliest timer on (past the tombstones of the timers fired before),
and one write batch of point deletions (range deletions would pile up in the
memtable, where every new iterator fragments them again). Which key groups
those are comes from a small array, the earliest timer per local key group and
domain: a lower bound, lowered by every registration, made exact again by a
seek when it is read, recomputed by a firing's scan, and rebuilt after a
restore by one seek per key group. Due timers come back in (timestamp, key id,
namespace) order, the heap service's order: with the same key table (the keys
in the order they first came) a disk job fires exactly as a heap job.

A pop returns at most ``firing_limit`` timers (Flink fires one at a time from
its RocksDB queue): a window that ends for millions of keys at once fires in
chunks, with a safe point (:meth:`DiskTimerService.release_keys`, the chunk's
output emitted) between them, so a firing's memory is bounded too. Each due key
group is read up to a cap (its share of the limit); if some group reached its
cap, only the timers read at or before the earliest last-read timestamp ``T``
of those groups fire (the earliest ``firing_limit`` of them), the rest stay, and
every later chunk starts at ``T`` or after: timestamps never go back from one
chunk to the next. Callers pop until a pop returns nothing.

Checkpoints
-----------
The entries are in the backend's database, so its full and incremental
snapshots, restores and rescaling carry them with their key groups: the
service writes no sections of its own (:meth:`DiskTimerService.snapshot`
gives none). A savepoint's disk sections hold them under kind ``"timers"``,
which a heap job's restore hands to its heap timer service
(:func:`restore_heap_timers`), and :meth:`DiskTimerService.restore` writes a
heap job's timer sections into RocksDB: a job switches backends through a
savepoint with its timers.

Key ids
-------
Callers name keys by dense int64 key ids, as with the heap service, but here
the key table is a cache: it holds the keys (and their encoded bytes, see
:meth:`DiskTimerService.codes`) of recent batches and firings only. The rule:
**a key id is valid until the next** :meth:`DiskTimerService.release_keys`,
which the operator calls between batches and firings, and which empties the
table once it holds more than ``key_table_limit`` keys. So an operator calls
it only if nothing it keeps across batches holds a key id (see
``KeyedOperator.release_key_ids``: keyed process functions; windows, which
reset their output key columns with the table and whose panes tell their
entries by :attr:`DiskTimerService.generation`; window joins and interval
joins, whose rows are stored under encoded keys). The timers themselves name
their keys by bytes, never by id.

    >>> import numpy as np
    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> from raystream.checkpoint.keygroups import key_group_of
    >>> backend = DiskKeyedStateBackend(max_parallelism=128, key_groups=range(128))
    >>> timers = DiskTimerService(backend)
    >>> keys = ["a", "b", "f"]
    >>> ids = timers.key_ids(keys, np.array([key_group_of(k, 128) for k in keys]))
    >>> timers.register_event_time_timers(ids, np.zeros(3, np.int64), np.array([30, 10, 20]))
    >>> timers.register_event_time_timer(ids[0], 0, 30)  # already set
    >>> timers.next_event_time(), timers.num_event_time_timers
    (10, 3)
    >>> ts, key_ids, _ = timers.advance_watermark(20)
    >>> ts.tolist(), timers.keys(key_ids)
    ([10, 20], ['b', 'f'])
    >>> timers.release_keys(force=True)   # ids are gone, the timers are not
    True
    >>> ts, key_ids, _ = timers.advance_watermark(100)
    >>> ts.tolist(), timers.keys(key_ids), timers.next_event_time()
    ([30], ['a'], None)
    >>> backend.close()
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterable, Iterator, cast

import numpy as np

from raystream.checkpoint.disk_layout import (MAX_ORDERED, SIGN, STATE_ID, encode_key, group_bound,
                                             ordered_array, ordered_key, ordered_value,
                                             state_id_of, state_prefix, unordered_array)
from raystream.checkpoint.disk_sections import TIMERS_KIND, section_timer_entries
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.timers.key_table import KeyTable
from raystream.timers.service import TimerService, read_timer_section

__all__ = ["DiskTimerService", "FIRING_LIMIT", "KEY_TABLE_LIMIT", "TimerDomain",
           "restore_heap_timers"]

KEY_TABLE_LIMIT = 1 << 16  # keys the key-id table holds before release_keys empties it
FIRING_LIMIT = KEY_TABLE_LIMIT  # timers one pop returns at most
_CAP_FLOOR = 64  # entries a pop may read from each due key group, at least
_NONE = np.iinfo(np.int64).max  # no timer in the key group
# an entry's head: key group, state id, timestamp + 2**63, namespace + 2**63 (the key follows)
_HEAD_DTYPE = np.dtype([("kg", ">u2"), ("sid", ">u2"), ("ts", ">u8"), ("ns", ">u8")])
_Timers = tuple[np.ndarray, np.ndarray, np.ndarray]


class TimerDomain(Enum):
    """Which clock a timer follows; the value names its raw state in the backend."""

    EVENT_TIME = "__timers_event_time"
    PROCESSING_TIME = "__timers_processing_time"


@dataclass
class _Domain:
    """One domain's state id and earliest timer per local key group."""

    sid: int
    earliest: np.ndarray  # int64 per local key group; _NONE: no timer
    exact: np.ndarray  # bool: earliest is the key group's earliest timer, not a lower bound


class DiskTimerService(KeyTable):
    """Timers of one keyed operator subtask in its disk backend's RocksDB, with the
    public interface of :class:`~raystream.timers.service.TimerService` (see the
    module docstring for the layout and the key-id rule). All methods run on the
    operator's processing thread."""

    def __init__(self, backend: DiskKeyedStateBackend, *,
                 key_table_limit: int = KEY_TABLE_LIMIT,
                 firing_limit: int = FIRING_LIMIT) -> None:
        super().__init__(max_parallelism=backend.max_parallelism,
                         key_groups=backend.key_groups)
        self._backend = backend
        self.key_table_limit = key_table_limit  # the key table's bound (see the rule above)
        self.firing_limit = firing_limit  # timers one pop returns at most
        n = len(self.key_groups)
        self._domains = {
            d: _Domain(state_id_of(backend.raw_state_id(d.value, TIMERS_KIND)),
                       np.full(n, _NONE, np.int64), np.ones(n, bool))
            for d in TimerDomain}
        self._generation = 0
        self.rebuild()

    @property
    def state_ids(self) -> frozenset[bytes]:
        """The backend state ids (two bytes after the key group) of the timer entries."""
        return frozenset(STATE_ID.pack(d.sid) for d in self._domains.values())

    # -- key table (a cache: ids valid until release_keys) ---------------------------
    def _clear_keys(self) -> None:
        super()._clear_keys()
        self._codes: list[bytes] = []
        self._by_code: dict[bytes, int] = {}

    def _append_key(self, key: Any, key_group: int, code: bytes | None = None) -> int:
        kid = super()._append_key(key, key_group)
        code = encode_key(key) if code is None else code
        self._codes.append(code)
        self._by_code[code] = kid
        return kid

    def key_ids_of_codes(self, codes: list[bytes], key_groups: np.ndarray) -> np.ndarray:
        """Ids of encoded keys read from the database (decoded only when not known)."""
        get = self._by_code.get
        found = list(map(get, codes))
        if None in found:
            decode, groups = DiskKeyedStateBackend.decode_key, key_groups.tolist()
            for i, kid in enumerate(found):
                if kid is None:
                    kid = get(codes[i])
                    found[i] = kid if kid is not None else self._append_key(
                        decode(codes[i]), groups[i], codes[i])
        return np.array(found, np.int64)

    def codes(self, key_ids: np.ndarray) -> list[bytes]:
        """The encoded keys (the backend's ``encode_key``) of ``key_ids``, in order: each
        key is encoded once per table, so disk layouts need no cache of their own."""
        ids = np.asarray(key_ids).tolist()
        if len(ids) < 2:
            return [self._codes[i] for i in ids]
        return list(operator.itemgetter(*ids)(self._codes))

    @property
    def generation(self) -> int:
        """How many times the key table was emptied: key ids of another generation are
        invalid (a layout that stores key ids tells its own by it)."""
        return self._generation

    def release_keys(self, *, force: bool = False) -> bool:
        """A safe point, between batches and firings: empty the key table if it holds
        more than ``key_table_limit`` keys (or ``force``); every key id given before is
        then invalid. True if it did."""
        if not force and len(self._keys) <= self.key_table_limit:
            return False
        self._clear_keys()
        self._generation += 1
        return True

    # -- entries -------------------------------------------------------------------
    def _entries(self, domain: TimerDomain, key_ids: np.ndarray, namespaces: np.ndarray,
                 timestamps: np.ndarray) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """The stored keys of timers (vectorized heads), their key groups and timestamps."""
        kids = self._check_key_ids(key_ids)
        n = len(kids)
        ts = np.broadcast_to(np.asarray(timestamps, np.int64), (n,))
        groups = self._kg[kids].astype(np.int64)
        head = np.empty(n, _HEAD_DTYPE)
        head["kg"] = groups
        head["sid"] = self._domains[domain].sid
        head["ts"] = ordered_array(ts)
        head["ns"] = ordered_array(np.broadcast_to(np.asarray(namespaces, np.int64), (n,)))
        data, width = head.tobytes(), _HEAD_DTYPE.itemsize
        keys = [data[at:at + width] + code
                for at, code in zip(range(0, n * width, width), self.codes(kids))]
        return keys, groups, ts

    def _register(self, domain: TimerDomain, key_ids: np.ndarray, namespaces: np.ndarray,
                  timestamps: np.ndarray) -> None:
        import rocksdict

        keys, groups, ts = self._entries(domain, key_ids, namespaces, timestamps)
        if not keys:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for k in keys:
            put(k, b"")
        self._backend.raw_db.write(batch)
        d = self._domains[domain]
        local = groups - self.key_groups.start
        before = d.earliest[local]
        np.minimum.at(d.earliest, local, ts)
        # a key group's earliest lowered by one of these timers is that timer: exact
        d.exact[local[ts < before]] = True

    def _delete(self, domain: TimerDomain, key_id: int, namespace: int, timestamp: int) -> None:
        keys, groups, _ = self._entries(domain, np.array([key_id], np.int64),
                                        np.array([namespace], np.int64),
                                        np.array([timestamp], np.int64))
        self._backend.raw_db.delete(keys[0])
        self._domains[domain].exact[int(groups[0]) - self.key_groups.start] = False

    def _bounds(self, domain: TimerDomain, group: int, timestamp: int | None = None) -> bytes:
        """The first possible entry of ``group`` in ``domain`` at ``timestamp`` (or at all)."""
        return ordered_key(group, self._domains[domain].sid,
                           -SIGN if timestamp is None else timestamp)

    @staticmethod
    def _first_at(start: bytes, it: Any) -> int:
        """The timestamp of the first timer at or after ``start`` within its key group
        and domain (one seek), or _NONE."""
        it.seek(start)
        if not it.valid():
            return _NONE
        key = it.key()
        if key[:4] != start[:4]:
            return _NONE
        return ordered_value(key)

    def _iterator(self) -> tuple[Any, Any]:
        read = self._backend.read_options(group_bound(self.key_groups.stop))
        return self._backend.raw_db.iter(read), read  # keep read referenced with it

    def rebuild(self) -> None:
        """The earliest timer of every key group, one seek each (after a restore)."""
        it, _read = self._iterator()
        for domain, d in self._domains.items():
            for i, group in enumerate(self.key_groups):
                d.earliest[i] = self._first_at(self._bounds(domain, group), it)
            d.exact[:] = True
        del it

    def _next(self, domain: TimerDomain) -> int | None:
        d = self._domains[domain]
        it = None
        while True:
            i = int(np.argmin(d.earliest))
            if d.earliest[i] == _NONE:
                return None
            if d.exact[i]:
                return int(d.earliest[i])
            if it is None:
                it, _read = self._iterator()
            # from the lower bound: past the tombstones of the timers fired before
            d.earliest[i] = self._first_at(
                self._bounds(domain, self.key_groups.start + i, int(d.earliest[i])), it)
            d.exact[i] = True

    def _pop_until(self, domain: TimerDomain, until: int) -> _Timers:
        """Delete and return the timers of ``domain`` with ``timestamp <= until``, at most
        ``firing_limit`` of them, the earliest: one bounded read per key group holding a
        due timer (at most ``cap`` entries each), one write batch of deletions. Call it
        again until it returns none; no later call returns an earlier timestamp."""
        d = self._domains[domain]
        due = np.flatnonzero(d.earliest <= until)
        if not len(due):
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        import rocksdict

        db, backend, limit = self._backend.raw_db, self._backend, self.firing_limit
        stop = None if until >= MAX_ORDERED else until + 1
        # per key group: a share of the limit (a floor so that a chunk fills when the due
        # timers are in few of the due groups); a group read up to its cap may hold more
        cap = max(min(_CAP_FLOOR, limit), limit // len(due) + 1)
        found: list[bytes] = []
        counts = np.zeros(len(due), np.int64)
        for at, i in enumerate(due.tolist()):
            group = self.key_groups.start + i
            # from the lower bound: past the tombstones of the timers fired before
            lo = self._bounds(domain, group, int(d.earliest[i]))
            hi = (self._bounds(domain, group, stop) if stop is not None
                  else state_prefix(group, d.sid + 1))
            read = backend.read_options(hi)
            keys = cast(Iterator[bytes], db.keys(from_key=lo, read_opt=read))
            before = len(found)
            found.extend(itertools.islice(keys, cap))
            del keys
            counts[at] = len(found) - before
        if not found:
            self._rescan(domain, due, stop)
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        width = _HEAD_DTYPE.itemsize
        head = np.frombuffer(b"".join([k[:width] for k in found]), _HEAD_DTYPE)
        ts = unordered_array(head["ts"])
        local = head["kg"].astype(np.int64) - self.key_groups.start
        ends = np.cumsum(counts)
        cut = counts == cap  # read up to the cap: more may be due in these groups
        take = np.ones(len(found), bool)
        if cut.any():
            # every timer not read is at or after the earliest last read one of a cut group
            take = ts <= ts[ends[cut] - 1].min()
        if int(take.sum()) > limit:  # the earliest `limit` of them (ties: any)
            take[np.flatnonzero(take)[np.argsort(ts[take], kind="stable")[limit:]]] = False
        chosen = np.flatnonzero(take)
        # Point deletions, not one range deletion per key group: every iterator created
        # later would fragment all range tombstones still in the memtable again.
        chosen_keys = [found[i] for i in chosen.tolist()]
        batch = rocksdict.WriteBatch(raw_mode=True)
        delete = batch.delete
        for k in chosen_keys:
            delete(k)
        db.write(batch)
        # the groups' earliest timers: a kept one read (exact: nothing earlier is left),
        # else the last read of a cut group (a lower bound), else after `until` (a seek)
        d.earliest[due] = _NONE
        kept = ~take
        np.minimum.at(d.earliest, local[kept], ts[kept])
        d.exact[due] = True
        emptied = d.earliest[due] == _NONE
        bounded = emptied & cut
        d.earliest[due[bounded]] = ts[ends[bounded] - 1]
        d.exact[due[bounded]] = False
        self._rescan(domain, due[emptied & ~cut], stop)
        ts, ns = ts[chosen], unordered_array(head["ns"][chosen])
        kids = self.key_ids_of_codes([k[width:] for k in chosen_keys],
                                     head["kg"][chosen].astype(np.int64))
        order = np.lexsort((ns, kids, ts))  # the heap service's order
        return ts[order], kids[order], ns[order]

    def _rescan(self, domain: TimerDomain, local: np.ndarray, stop: int | None) -> None:
        """The earliest timers of local key groups ``local`` with none due: the first one
        at or after ``stop`` (one seek each; None: none left)."""
        d = self._domains[domain]
        if stop is None:
            d.earliest[local] = _NONE
        elif len(local):
            it, _read = self._iterator()
            for i in local.tolist():
                d.earliest[i] = self._first_at(
                    self._bounds(domain, self.key_groups.start + i, stop), it)
            del it
        d.exact[local] = True

    def _count(self, domain: TimerDomain) -> int:
        """How many timers ``domain`` holds: a scan (for tests and metrics, not hot paths)."""
        db, backend, sid, n = self._backend.raw_db, self._backend, self._domains[domain].sid, 0
        for group in self.key_groups:
            read = backend.read_options(state_prefix(group, sid + 1))
            n += sum(1 for _ in db.keys(from_key=state_prefix(group, sid), read_opt=read))
        return n

    # -- event time ----------------------------------------------------------------
    def register_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Fire at ``timestamp`` once the watermark reaches it (no-op if already set)."""
        self._register(TimerDomain.EVENT_TIME, np.array([key_id], np.int64),
                       np.array([namespace], np.int64), np.array([timestamp], np.int64))

    def register_event_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                   timestamps: np.ndarray) -> None:
        """Bulk :meth:`register_event_time_timer` (one write batch)."""
        self._register(TimerDomain.EVENT_TIME, key_ids, namespaces, timestamps)

    def delete_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Delete an event-time timer (no-op if absent)."""
        self._delete(TimerDomain.EVENT_TIME, key_id, namespace, timestamp)

    def advance_watermark(self, watermark: int) -> _Timers:
        """Delete and return the event-time timers with ``timestamp <= watermark``:
        (timestamps, key_ids, namespaces) in timestamp order, at most ``firing_limit``
        of them (the earliest): call it again, after a safe point, until none comes."""
        return self._pop_until(TimerDomain.EVENT_TIME, watermark)

    def next_event_time(self) -> int | None:
        """The earliest event-time timer's timestamp, or None."""
        return self._next(TimerDomain.EVENT_TIME)

    @property
    def num_event_time_timers(self) -> int:
        return self._count(TimerDomain.EVENT_TIME)

    # -- processing time -------------------------------------------------------------
    def register_processing_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Fire at wall-clock ``timestamp`` (ms; no-op if already set)."""
        self._register(TimerDomain.PROCESSING_TIME, np.array([key_id], np.int64),
                       np.array([namespace], np.int64), np.array([timestamp], np.int64))

    def register_processing_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                        timestamps: np.ndarray) -> None:
        """Bulk :meth:`register_processing_time_timer` (one write batch)."""
        self._register(TimerDomain.PROCESSING_TIME, key_ids, namespaces, timestamps)

    def delete_processing_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Delete a processing-time timer (no-op if absent)."""
        self._delete(TimerDomain.PROCESSING_TIME, key_id, namespace, timestamp)

    def next_processing_time(self) -> int | None:
        """The earliest processing-time timer's timestamp (when to wake up), or None."""
        return self._next(TimerDomain.PROCESSING_TIME)

    def fire_processing_time(self, now_ms: int) -> _Timers:
        """Delete and return the processing-time timers with ``timestamp <= now_ms``, at
        most ``firing_limit`` of them, as :meth:`advance_watermark` does."""
        return self._pop_until(TimerDomain.PROCESSING_TIME, now_ms)

    @property
    def num_processing_time_timers(self) -> int:
        return self._count(TimerDomain.PROCESSING_TIME)

    # -- checkpoints -----------------------------------------------------------------
    def snapshot(self) -> Callable[[], dict[int, bytes]]:
        """No sections: the timers are in the backend's snapshot."""
        return dict

    def restore(self, sections: Iterable[tuple[int, bytes]] | Mapping[int, bytes]) -> None:
        """Write the timers of a heap job's timer ``sections`` (a savepoint) into RocksDB,
        keeping this subtask's key groups."""
        if isinstance(sections, Mapping):
            sections = cast(Mapping[int, bytes], sections).items()
        for kg, data in sections:
            if kg not in self.key_groups:
                continue
            section = read_timer_section(kg, data, self.max_parallelism)
            ids = self.key_ids(section.keys, np.full(len(section.keys), kg, np.int64))
            for domain, (ts, local, ns) in ((TimerDomain.EVENT_TIME, section.event),
                                            (TimerDomain.PROCESSING_TIME, section.processing)):
                self._register(domain, ids[local], ns, ts)
            self.release_keys()

    def __repr__(self) -> str:
        return (f"DiskTimerService(key_groups={self.key_groups!r}, keys={len(self._keys)})")


def restore_heap_timers(timers: TimerService, sections: Iterable[tuple[int, bytes]]) -> None:
    """Hand the timer entries of a disk job's keyed-state ``sections`` (a savepoint) to a
    heap job's ``timers``."""
    width = _HEAD_DTYPE.itemsize
    for kg, section in sections:
        if kg not in timers.key_groups:
            continue
        by_domain: dict[str, list[bytes]] = {d.value: [] for d in TimerDomain}
        for name, suffix in section_timer_entries(kg, section, timers.max_parallelism):
            by_domain[name].append(suffix)
        parts = []
        for domain in TimerDomain:
            # the suffix is the entry's key after its key group and state id
            entries = by_domain[domain.value]
            if not entries:
                parts.append((np.empty(0, np.int64), [], np.empty(0, np.int64)))
                continue
            head = np.frombuffer(b"".join([b"\0\0\0\0" + e[:width - 4] for e in entries]),
                                 _HEAD_DTYPE)
            keys = [DiskKeyedStateBackend.decode_key(e[width - 4:]) for e in entries]
            parts.append((unordered_array(head["ts"]), keys, unordered_array(head["ns"])))
        if any(len(p[1]) for p in parts):
            timers.restore_keyed_timers(kg, parts[0], parts[1])
