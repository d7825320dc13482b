"""State time-to-live: :class:`StateTtlConfig` (Flink's ``StateTtlConfig``).

Give a keyed state a TTL when you create it (``ctx.value_state("seen", ttl=...)``,
the same ``ttl=`` on list, map, reducing and aggregating state). Every value (every
element of a list state, every entry of a map state) then carries the processing
time it was last written (or, with ``update_on="read_and_write"``, also read); once
``ttl_ms`` have passed it is expired: invisible to reads, removed when read, removed
by an incremental cleanup that checks a few entries of the state on every access,
and left out of checkpoints and savepoints. The timestamps are stored with the
values, so a restored job expires them on the original schedule.

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
from typing import Any, Callable

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
        if e[1] + cfg.ttl_ms <= now:
            del entries[k]
            changed = True
            if cfg.return_expired:
                out.append((k, e[0]))
        else:
            if cfg.renew_on_read:
                entries[k] = type(e)((e[0], now))  # as stored: a tuple, or a list on disk
                changed = True
            out.append((k, e[0]))
    return out, changed


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
