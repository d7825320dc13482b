"""What a job master notes for the one Ray restarts after its process died.

A job with checkpoints runs its master with ``max_restarts``: when the
master's process dies, Ray runs its constructor again (same arguments) and
the new master takes the job over from its newest completed checkpoint
(FLIP-6's JobMaster failover, with Ray as the supervisor). What the new
master cannot find in the checkpoints is here, in the GCS key-value store:

* the attempts: before it deploys an attempt, a master notes its number, so
  the next master deploys a number above every attempt that may have run —
  messages of older attempts are dropped everywhere, and a sink's files are
  named by attempt;
* the failures so far, which the restart strategy counts (a master's death is
  one more), and the restores they led to;
* when the job started, for its summary;
* the newest stop savepoint whose completion it notified: it committed output,
  so a restore must not go back past it, and it lies in the savepoint's
  directory, where the job's checkpoints are not looked for.

    >>> entry = JournalEntry(attempt=2, started_at=0.0, failures=({"error": "boom"},) * 2,
    ...                      restores=({"attempt": 1}, {"attempt": 2}),
    ...                      savepoint=CommittedSavepoint(7, "/tmp/sp"))
    >>> JournalEntry.from_json(entry.to_json()) == entry
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ray.experimental import internal_kv

from raystream.checkpoint.coordinator import CommittedSavepoint
from raystream.engine.registry import KV_NAMESPACE

KEY_PREFIX = "master:"


@dataclass(frozen=True)
class JournalEntry:
    """The attempt a master deployed last, with the failures and restores that led to it."""

    attempt: int
    started_at: float
    failures: tuple[dict[str, Any], ...]  # Failover.failure_details, oldest first
    restores: tuple[dict[str, Any], ...]  # the job master's restores, oldest first
    savepoint: CommittedSavepoint | None = None

    def to_json(self) -> str:
        savepoint = self.savepoint
        return json.dumps({"attempt": self.attempt, "started_at": self.started_at,
                           "failures": list(self.failures), "restores": list(self.restores),
                           "savepoint": None if savepoint is None else
                           {"checkpoint_id": savepoint.checkpoint_id,
                            "location": savepoint.location}},
                          default=str)

    @classmethod
    def from_json(cls, text: str | bytes) -> JournalEntry:
        raw = json.loads(text)
        savepoint = raw.get("savepoint")
        return cls(raw["attempt"], raw["started_at"], tuple(raw["failures"]),
                   tuple(raw["restores"]),
                   None if savepoint is None else CommittedSavepoint(
                       int(savepoint["checkpoint_id"]), str(savepoint["location"])))


def note(job_id: str, entry: JournalEntry) -> None:
    """Note ``entry`` before its attempt is deployed (replacing the previous one)."""
    internal_kv._internal_kv_put(KEY_PREFIX + job_id, entry.to_json(), overwrite=True,
                                 namespace=KV_NAMESPACE)


def read(job_id: str) -> JournalEntry | None:
    """The newest entry a master of ``job_id`` noted (None: none deployed anything)."""
    raw = internal_kv._internal_kv_get(KEY_PREFIX + job_id, namespace=KV_NAMESPACE)
    return None if raw is None else JournalEntry.from_json(raw)


def forget(job_id: str) -> None:
    """The job is over: no master will take it over."""
    internal_kv._internal_kv_del(KEY_PREFIX + job_id, namespace=KV_NAMESPACE)
