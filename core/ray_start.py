"""Starting Ray in this process, or connecting to a cluster: :func:`ensure_ray`.

The environment calls it before a job runs, and ``rs.spark.session()`` before
RayDP starts Spark, so both get the same Ray: quiet unless verbose
(:mod:`raystream.core.logs`), and on loopback when raystream starts it.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

import ray

from raystream.core.cluster_mark import mark_cluster
from raystream.core.logs import quiet_ray, quiet_raylet_messages


# Ray deletes released objects in periodic batches (1 s by default), so a
# consumed batch would linger for up to a second and in-flight memory would be
# "credits + one second of throughput". A short period keeps it at "credits".
# On a cluster, set RAY_free_objects_period_milliseconds=50 where Ray starts.
EMBEDDED_RAY_SYSTEM_CONFIG = {"free_objects_period_milliseconds": 50}


def ensure_ray(address: str | None = None, **init_kwargs: Any) -> None:
    """Start Ray in this process (or connect to ``address``) unless it is already up.

    Without ``address``, a ``RAY_ADDRESS`` in the environment names the cluster
    (the Jobs API sets it for the drivers it starts), as for ``ray.init()``.
    The Ray it starts itself serves this machine only: see :func:`loopback_node`.
    Either way the cluster is marked as raystream's (:mod:`raystream.core.cluster_mark`).
    """
    if not ray.is_initialized():
        _start_or_join(address, init_kwargs)
    mark_cluster()


def _start_or_join(address: str | None, init_kwargs: dict[str, Any]) -> None:
    init_kwargs.setdefault("include_dashboard", False)
    quiet_ray(init_kwargs)
    if address is None and os.environ.get("RAY_ADDRESS", "local") in ("", "local"):
        # "local": always a Ray of our own, even where `ray start` left a cluster
        # running on this machine (plain ray.init() would attach to that one).
        address = "local"
        init_kwargs.setdefault("_system_config", EMBEDDED_RAY_SYSTEM_CONFIG)
        loopback_node()
    elif is_loopback_address(address or os.environ.get("RAY_ADDRESS", "")):
        loopback_node()  # or Ray looks for 127.0.0.1's cluster at this machine's external IP
    if init_kwargs.get("log_to_driver") is False:  # (else the caller asked for Ray's output)
        quiet_raylet_messages()  # before its printing thread starts
    ray.init(address=address, **init_kwargs)


def is_loopback_address(address: str) -> bool:
    """Whether a ``host:port`` address is on loopback (``127.0.0.1:6379``, ``localhost:6379``).

        >>> is_loopback_address("127.0.0.1:6379"), is_loopback_address("10.0.0.5:6379")
        (True, False)
    """
    if "://" in address:
        return False  # ray://... goes through the Ray Client, not a local raylet
    return is_loopback(address.rpartition(":")[0].strip("[]"))


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_node() -> None:
    """Make the embedded Ray's node address 127.0.0.1, so that its servers (GCS,
    raylet, object manager, workers) listen on loopback only; a driver that joins
    a Ray on loopback needs the same (else Ray turns 127.0.0.1 into this machine's
    external address, where nothing listens).

    Ray binds its servers to the node's IP, and on Linux it turns a loopback
    ``_node_ip_address`` into the first external interface's address, since a
    cluster needs one. Its single-machine mode (the default on macOS and
    Windows, switched by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``) keeps loopback.
    The variable is read when Ray is imported, so this process's copy is set
    too; the processes Ray starts inherit the variable. A Ray ``ray start``
    launched for several machines is not affected.
    """
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
