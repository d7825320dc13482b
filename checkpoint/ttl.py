"""State time-to-live: :class:`StateTtlConfig` (Flink's ``StateTtlConfig``).

Give a keyed state a TTL when you create it (``ctx.value_state("seen", ttl=...)``,
the same ``ttl=`` on list, map, reducing and aggregating state). Every value (every
element of a list state, every entry of a map state) then carries the processing
time it was last written (or, with ``update_on="read_and_write"``, also read); once
``ttl_ms`` have passed it is expired: invisible to reads, removed when read, removed
by an incremental cleanup that checks a few entries of the state on every access,
and left out of checkpoints and savepoints. The timestamps are stored with the
values, so a restored job expires them on the original schedule.

Both keyed-state backends follow the rules here (:func:`is_expired`, what a read
returns, removes and renews, what is live); each keeps its own stored form.

    >>> import raystream as rs
    >>> ttl = rs.StateTtlConfig(60_000, update_on="read_and_write")
    >>> ttl.update_on, ttl.visibility
    (<TtlUpdate.READ_AND_WRITE: 'read_and_write'>, <TtlVisibility.NEVER_RETURN_EXPIRED: 'never_return_expired'>)
    >>> rs.StateTtlConfig(0)
    Traceback (most recent call last):
    ...
    ValueError: StateTtlConfig: ttl_ms must be a positive number of milliseconds, got 0
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["TTL_KIND_SUFFIX", "StateTtlConfig", "TtlTimeProvider", "TtlUpdate", "TtlVisibility",
           "check_state_kind", "ttl_kind", "wall_clock_ms"]

TtlTimeProvider = Callable[[], int]  # processing time in ms since the epoch

# The kind of a state with a TTL in a snapshot's directory, on either backend: the
# plain kind plus this suffix, so a restore knows its values carry timestamps.
TTL_KIND_SUFFIX = "+ttl"


def wall_clock_ms() -> int:
    """The default TTL clock: the wall clock in ms (processing time, as in Flink)."""
    return int(time.time() * 1000)


class TtlUpdate(enum.Enum):
    """When a value's TTL timestamp is renewed."""

    CREATE_AND_WRITE = "create_and_write"  # on create and every write
    READ_AND_WRITE = "read_and_write"      # also on every read of an unexpired value


class TtlVisibility(enum.Enum):
    """Whether a read may return a value that has expired but is still stored."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    # returned once by the read that finds (and removes) it
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


def _coerce(enum_type: type[enum.Enum], value: object, field: str) -> enum.Enum:
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        options = ", ".join(repr(m.value) for m in enum_type)
        raise ValueError(f"StateTtlConfig: {field} must be one of {options} "
                         f"(or rs.{enum_type.__name__}), got {value!r}") from None


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live of a keyed state's values, in processing time.

    ``ttl_ms``: how long a value lives after its last renewal. ``update_on``
    (:class:`TtlUpdate` or its string value): renew on writes only, or on reads
    too. ``visibility`` (:class:`TtlVisibility` or its string value): may a read
    return an expired value that no cleanup has removed yet.
    ``cleanup_per_access``: how many stored entries of the state the
    incremental cleanup checks on each access (Flink's incremental cleanup; it
    keeps memory bounded for keys that are never read again).
    """

    ttl_ms: int
    update_on: TtlUpdate | str = TtlUpdate.CREATE_AND_WRITE
    visibility: TtlVisibility | str = TtlVisibility.NEVER_RETURN_EXPIRED
    cleanup_per_access: int = 5

    def __post_init__(self) -> None:
        if (isinstance(self.ttl_ms, bool) or not isinstance(self.ttl_ms, (int, float))
                or not self.ttl_ms > 0):
            raise ValueError(f"StateTtlConfig: ttl_ms must be a positive number of "
                             f"milliseconds, got {self.ttl_ms!r}")
        if (isinstance(self.cleanup_per_access, bool) or not isinstance(self.cleanup_per_access, int)
                or self.cleanup_per_access < 0):
            raise ValueError(f"StateTtlConfig: cleanup_per_access must be an int >= 0, "
                             f"got {self.cleanup_per_access!r}")
        object.__setattr__(self, "ttl_ms", int(self.ttl_ms))
        object.__setattr__(self, "update_on", _coerce(TtlUpdate, self.update_on, "update_on"))
        object.__setattr__(self, "visibility",
                           _coerce(TtlVisibility, self.visibility, "visibility"))

    @property
    def renew_on_read(self) -> bool:
        return self.update_on is TtlUpdate.READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        return self.visibility is TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP


def ttl_kind(kind: str, name: str, ttl: "StateTtlConfig | None") -> str:
    """The stored kind of state ``name`` of ``kind`` declared with ``ttl``.

    >>> ttl_kind("list", "seen", StateTtlConfig(10)), ttl_kind("list", "seen", None)
    ('list+ttl', 'list')
    """
    if ttl is None:
        return kind
    if not isinstance(ttl, StateTtlConfig):
        raise TypeError(f"state {name!r}: ttl must be a rs.StateTtlConfig, "
                        f"got {type(ttl).__name__}")
    return kind + TTL_KIND_SUFFIX


def check_state_kind(name: str, had: str, kind: str) -> None:
    """Refuse to declare state ``name``, stored as ``had``, as ``kind`` (stored kinds,
    see :func:`ttl_kind`) when they differ; a state that gains or loses its TTL is
    refused as in Flink (its stored values differ in shape)."""
    if had == kind:
        return
    was, now = had.endswith(TTL_KIND_SUFFIX), kind.endswith(TTL_KIND_SUFFIX)
    if was != now:
        raise ValueError(
            f"state {name!r} has {'a' if was else 'no'} TTL (as declared before, or "
            f"as restored from a checkpoint) and is now declared "
            f"{'with' if now else 'without'} one: a state cannot gain or lose its "
            f"TTL (give it another name, or keep the ttl= it was created with)")
    raise ValueError(f"state {name!r} is {had} state, not {kind} state")


# ---------------------------------------------------------------------------
# The TTL rules both backends follow; each keeps its own stored form (the heap
# ``(value, ts)`` tuples, the disk ``ts | msgpack`` bytes) behind the hooks below.
# An element of a list or an entry of a map is stored as ``(value, ts)`` on the
# heap and ``[value, ts]`` on disk; a renewal keeps that type.
# ---------------------------------------------------------------------------

_UNSET: Any = object()  # no value: unset, or expired and hidden


def is_expired(ts: Any, ttl_ms: int, now: int) -> Any:
    """Whether a value last renewed at ``ts`` has expired at ``now``: ``ttl_ms`` have
    passed. ``ts`` may be a numpy array of timestamps (then an array of bools); it is
    compared with ``now - ttl_ms`` so a sentinel maximum timestamp cannot overflow.

        >>> is_expired(900, 100, 1000), is_expired(901, 100, 1000)
        (True, False)
    """
    return ts <= now - ttl_ms


def live_elements(entries: list, ttl_ms: int, now: int) -> list:
    """The ``(value, ts)`` elements of ``entries`` not expired at ``now`` (a new list)."""
    cut = now - ttl_ms
    return [e for e in entries if e[1] > cut]


def live_entries(entries: dict, ttl_ms: int, now: int) -> dict:
    """The ``key: (value, ts)`` entries of ``entries`` not expired at ``now`` (a new dict)."""
    cut = now - ttl_ms
    return {k: e for k, e in entries.items() if e[1] > cut}


def _renewed(e: Any, now: int) -> Any:
    return type(e)((e[0], now))  # as stored: a tuple, or a list on disk


def read_elements(stored: list, cfg: StateTtlConfig, now: int) -> tuple[list, list | None]:
    """What a read of a list state with a TTL sees: the elements of ``stored`` (its
    ``(element, ts)`` pairs) that are live (or all of them, expired ones returned once,
    when the visibility allows it), and the list to store in its place, or None when
    it is unchanged: the expired elements dropped, the live ones renewed when reads
    renew (an empty list: store nothing). Both backends' list states read through it.

        >>> cfg = StateTtlConfig(ttl_ms=100)
        >>> read_elements([("a", 0), ("b", 950)], cfg, now=1000)
        (['b'], [('b', 950)])
    """
    live = live_elements(stored, cfg.ttl_ms, now)
    out = [e[0] for e in (stored if cfg.return_expired else live)]
    if cfg.renew_on_read:
        return out, [_renewed(e, now) for e in live]
    return out, (live if len(live) != len(stored) else None)


def read_entry(entries: dict, key: Any, cfg: StateTtlConfig, now: int,
               default: Any) -> tuple[Any, bool]:
    """What a read of ``key`` in a map state with a TTL sees (``default`` when it is
    absent, or expired and hidden), from ``entries`` (user key -> ``(value, ts)``),
    which it changes in place as :func:`read_entries` does. Returns the value and
    whether ``entries`` changed.

        >>> entries = {"a": (1, 0)}
        >>> read_entry(entries, "a", StateTtlConfig(ttl_ms=100), 1000, None), entries
        ((None, True), {})
    """
    e = entries.get(key, _UNSET)
    if e is _UNSET:
        return default, False
    if is_expired(e[1], cfg.ttl_ms, now):
        del entries[key]
        return (e[0] if cfg.return_expired else default), True
    if cfg.renew_on_read:
        entries[key] = _renewed(e, now)
        return e[0], True
    return e[0], False


def read_entries(entries: dict, cfg: StateTtlConfig,
                 now: int) -> tuple[list[tuple[Any, Any]], bool]:
    """What a read of a map state with a TTL sees: its ``(user key, value)`` pairs, from
    ``entries`` (user key -> ``(value, timestamp)``, a tuple or a list), which it changes
    in place: expired entries are removed (and returned once when the visibility allows
    it), the others renewed when reads renew. Returns the pairs and whether ``entries``
    changed. Both backends' map states read through it.

        >>> cfg = StateTtlConfig(ttl_ms=100, update_on="read_and_write")
        >>> entries = {"a": (1, 0), "b": (2, 950)}
        >>> read_entries(entries, cfg, now=1000), entries
        (([('b', 2)], True), {'b': (2, 1000)})
    """
    out, changed = [], False
    for k, e in list(entries.items()):
        if is_expired(e[1], cfg.ttl_ms, now):
            del entries[k]
            changed = True
            if cfg.return_expired:
                out.append((k, e[0]))
        else:
            if cfg.renew_on_read:
                entries[k] = _renewed(e, now)
                changed = True
            out.append((k, e[0]))
    return out, changed


class TtlHandle:
    """Mixin of both backends' handles of a state with a TTL: the clock with its
    incremental cleanup step, and no namespace merging. ``_b`` is the backend (its
    ``_ttl_now()`` clock and ``_cleanup_step(record, now)``), ``_t`` its record of
    the state's TTL."""

    __slots__ = ()
    _b: Any
    _t: Any

    def _check_key(self) -> None:  # pragma: no cover - each backend's
        """Raise unless the backend has a current key."""
        raise NotImplementedError

    def _ttl_name(self) -> str:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _tick(self) -> int:
        """The current processing time, after one incremental cleanup step over this state."""
        self._check_key()
        b = self._b
        now = b._ttl_now()
        b._cleanup_step(self._t, now)
        return now

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        raise NotImplementedError(f"state {self._ttl_name()!r}: namespaces of a state with a "
                                  f"TTL cannot be merged (window state has no TTL)")


class TtlSingle(TtlHandle):
    """Value, reducing and aggregating state with a TTL, both backends': one value and
    its timestamp per key. A backend gives the stored entry of the current key
    (``_ttl_load``, None when unset), its timestamp and value, and how to remove,
    renew and write it."""

    __slots__ = ()

    def _ttl_cfg(self) -> StateTtlConfig:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_load(self) -> Any:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_stamp(self, entry: Any) -> int:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_value(self, entry: Any) -> Any:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_drop(self) -> None:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_renew(self, entry: Any, now: int) -> None:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _ttl_write(self, value: Any, now: int) -> None:  # pragma: no cover - each backend's
        raise NotImplementedError

    def _live(self, now: int) -> Any:
        """The current value (``_UNSET`` if unset or expired and hidden); removes an
        expired one, renews a live one when reads renew."""
        e = self._ttl_load()
        if e is None:
            return _UNSET
        cfg = self._ttl_cfg()
        if is_expired(self._ttl_stamp(e), cfg.ttl_ms, now):
            self._ttl_drop()
            return self._ttl_value(e) if cfg.return_expired else _UNSET
        if cfg.renew_on_read:
            self._ttl_renew(e, now)
        return self._ttl_value(e)

    def _live_for_write(self, now: int) -> Any:
        """The unexpired value to combine a write with (an expired one counts as unset)."""
        e = self._ttl_load()
        if e is None or is_expired(self._ttl_stamp(e), self._ttl_cfg().ttl_ms, now):
            return _UNSET
        return self._ttl_value(e)


class TtlValueOps(TtlSingle):
    """``value`` and ``update`` of a value state with a TTL."""

    __slots__ = ()
    _default_value: Callable[[], Any]  # each backend's value state: a fresh copy of its default

    def value(self) -> Any:
        v = self._live(self._tick())
        return self._default_value() if v is _UNSET else v

    def update(self, value: Any) -> None:
        self._ttl_write(value, self._tick())


class TtlReducingOps(TtlSingle):
    """``get`` and ``add`` of a reducing state with a TTL: an expired value counts as unset."""

    __slots__ = ()
    _reduce: Callable[[Any, Any], Any]

    def get(self) -> Any:
        v = self._live(self._tick())
        return None if v is _UNSET else v

    def add(self, value: Any) -> None:
        now = self._tick()
        cur = self._live_for_write(now)
        self._ttl_write(value if cur is _UNSET else self._reduce(cur, value), now)


class TtlAggregatingOps(TtlSingle):
    """``get`` and ``add`` of an aggregating state with a TTL: an expired accumulator
    counts as unset."""

    __slots__ = ()
    _agg: Any

    def get(self) -> Any:
        acc = self._live(self._tick())
        return None if acc is _UNSET else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        now = self._tick()
        acc = self._live_for_write(now)
        if acc is _UNSET:
            acc = self._agg.create_accumulator()
        self._ttl_write(self._agg.add(value, acc), now)


class TtlMapReads:
    """The reads of a map state with a TTL, both backends': each sees the entries that
    ``_entries()`` (its backend's, through :func:`read_entries`) leaves visible."""

    __slots__ = ()

    def _entries(self) -> list[tuple[Any, Any]]:  # pragma: no cover - each backend's
        raise NotImplementedError

    def keys(self) -> list:
        return [k for k, _ in self._entries()]

    def values(self) -> list:
        return [v for _, v in self._entries()]

    def items(self) -> list:
        return self._entries()

    def is_empty(self) -> bool:
        return not self._entries()
