"""The record layout of a disk window state that stores built-in aggregates' partials.

:class:`~raystream.engine.windows.disk_panes.DiskPanes` (dense windows) and
:class:`~raystream.engine.windows.disk_sessions.DiskSessions` (open sessions) store
their partials as fixed-width numpy records with a few fields of their own beside
the partial columns. The record is fixed by the first partials the state sees, or
comes back with the state on a restore; :class:`PartialsState` holds it, the
partial columns and the state's raw id, for both.
"""

from __future__ import annotations

import numpy as np

from raystream.checkpoint.disk_layout import record_fields
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.timers.disk_service import DiskTimerService


class PartialsState:
    """The record, partial columns and state id of one partials state: the panes and the
    sessions lay out their records alike but for their own fields."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService, *, state: str,
                 kind: str, own: tuple[str, ...], where: str) -> None:
        self._backend = backend
        self._timers = timers
        self._where = where  # names the operator in errors about the record
        self._state = state
        self._own = own  # the record's fields that are not partials
        self.record: np.dtype | None = None
        self._columns: list[str] = []  # the record's partial columns
        self._sid = b""
        restored = backend.state_kind(state)
        if restored is not None:  # the record comes with the state
            self._use(np.dtype(record_fields(kind, restored)), restored)

    @property
    def timers(self) -> DiskTimerService:
        """The timer service whose key ids name this state's keys."""
        return self._timers

    def _use(self, record: np.dtype, kind: str) -> None:
        """Fix the state's record (first partials or restore) and the columns it holds."""
        self.record = record
        self._columns = [n for n in record.names or () if n not in self._own]
        self._sid = self._backend.raw_state_id(self._state, kind)
