"""What ``execute()`` checks on the driver before Ray starts, for a job that runs on this
machine: each a one-line :class:`~raystream.engine.errors.JobSetupError` naming what is
wrong, in a second rather than after the job's actors started.

* every source's and sink's own checks (a path ``read_files`` reads exists:
  :meth:`Source.preflight`; a Kafka source's or sink's broker answers and has its topics:
  :mod:`raystream.engine.kafka_client`);
* the checkpoint storage is writable (a probe file is created in it and deleted);
* ``restore_from`` holds a complete savepoint or checkpoint (its metadata).

On a cluster the driver may see other paths (and reach other brokers) than the job's
actors, so these checks are left to the job master there (:func:`runs_here`).

    >>> runs_here(None, environ={}), runs_here("10.0.0.5:6379", environ={})
    (True, False)
    >>> runs_here(None, environ={}, connected_gcs="10.0.0.5:6379")  # a Ray joined already
    False
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

import ray

from raystream.checkpoint.coordinator import locate_snapshot
from raystream.checkpoint.storage import CheckpointStorage
from raystream.core.ray_start import is_loopback_address
from raystream.engine.errors import JobSetupError


def runs_here(address: str | None, *, environ: Mapping[str, str] = os.environ,
              connected_gcs: str | None = None) -> bool:
    """Whether a job of a driver joining ``address`` runs on this machine: the embedded
    Ray (no address, none in ``RAY_ADDRESS``), or one on loopback. ``connected_gcs``: the
    GCS of the Ray this process is connected to already (``""``: one of unknown address),
    which decides instead (the embedded one serves loopback: core/ray_start.py)."""
    if connected_gcs is not None:
        return bool(connected_gcs) and is_loopback_address(connected_gcs)
    address = address or environ.get("RAY_ADDRESS") or None
    return address in (None, "local") or is_loopback_address(address)


def connected_gcs() -> str | None:
    """The GCS address of the Ray this process is connected to, ``""`` if it cannot say
    (the Ray Client), None if Ray is not up here."""
    if not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # (the Ray Client has no GCS address to give)
        return ""


def check(source_checks: Iterable[Callable[[], None]], *, storage: str | None,
          restore_from: str | None) -> None:
    """Raise :class:`JobSetupError` for the first thing that would keep the job from
    starting (see the module docs)."""
    for source_check in source_checks:
        source_check()
    if storage is not None:
        try:
            CheckpointStorage(storage).check_writable()
        except OSError as exc:
            raise JobSetupError(f"CheckpointConfig(storage={storage!r}): {exc}") from exc
    if restore_from is not None:
        _check_restore_point(restore_from)


def _check_restore_point(path: str) -> None:
    """A complete savepoint or checkpoint is there (its metadata file; the state files'
    checksums, a read of them all, are the job master's to verify)."""
    try:
        uri, key = locate_snapshot(path)
        found = CheckpointStorage(uri).completed_checkpoint_ids(key)
    except (OSError, ValueError) as exc:
        raise JobSetupError(f"restore_from={path!r}: {exc}") from exc
    if not found:
        raise JobSetupError(f"restore_from={path!r}: no complete savepoint or checkpoint "
                            f"there (a savepoint's directory, or a job's checkpoint "
                            f"directory holding chk-<n> directories)")
