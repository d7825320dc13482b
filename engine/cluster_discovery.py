"""Which Ray the ``raystream`` command joins when none is named: raystream's own on
this machine, found within seconds, never an unrelated Ray that happens to run here.

The candidates are the Rays of this machine's Ray temp directory (``RAY_TMPDIR``,
else ``TMPDIR``, else ``/tmp``, then ``/ray``; as ``ray.init()`` looks there): the
one ``ray start`` last recorded (``ray_current_cluster``), as on the head of a
``ray up cluster.yaml`` cluster, and every raylet process of that directory, as an
embedded Ray of a driver (``raystream run``, a notebook). Each is asked, with a
timeout and through a GCS client only (no driver joins it), whether its key-value
store has raystream's mark (:mod:`raystream.core.cluster_mark`). Exactly one
marked Ray is the answer; anything else is a one-line error that says what was
found and how to name the cluster (``--address``, ``RAY_ADDRESS``). Token
authentication is on as ``ray.init()`` has it for a Ray it finds by itself.

    >>> classify_keys([b"cluster"]), classify_keys([])
    ('raystream', 'other')
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from raystream.core.cluster_mark import KV_NAMESPACE
from raystream.core.errors import RaystreamError

PROBE_TIMEOUT_S = 3.0  # a GCS's answer (candidates are asked at once): a live one takes ms
CONNECT_TIMEOUT_S = 1.0  # a GCS port that takes no TCP connection is no candidate
HOW_TO_NAME = "name the cluster with --address HOST:PORT or RAY_ADDRESS=HOST:PORT"
T = TypeVar("T")


class ClusterNotFoundError(RaystreamError, ConnectionError):
    """No single raystream cluster on this machine: the message says what was found."""


@dataclass(frozen=True)
class Probe:
    """What a candidate Ray answered: ``raystream``, ``other`` (never ran raystream),
    ``refused`` (its token authentication refused this client) or ``silent``."""

    address: str
    kind: str
    detail: str = ""


def ray_temp_dir() -> Path:
    """Ray's temp directory on this machine, as ``ray.init()`` and ``ray start`` use it."""
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def use_token_if_available() -> None:
    """Token authentication on when ``RAY_AUTH_MODE`` is unset and a token exists
    (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN_PATH``, ``RAY_AUTH_TOKEN``), as
    ``ray.init()`` does for a Ray on this machine it finds by itself (Ray 2.60 starts
    local Rays with token authentication on by default). It only ever turns it on."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available)

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def candidates(temp_dir: Path) -> list[str]:
    """GCS addresses of the Rays of ``temp_dir``: the one ``ray start`` recorded, then
    those of the raylet processes running with that directory."""
    found: list[str] = []
    recorded = temp_dir / "ray_current_cluster"
    if recorded.is_file():
        found.append(recorded.read_text().strip())
    for address in _raylet_gcs_addresses(temp_dir):
        if address not in found:
            found.append(address)
    return [a for a in found if a]


def _raylet_gcs_addresses(temp_dir: Path) -> list[str]:
    wanted = os.path.realpath(temp_dir)
    return [flags["--gcs-address"] for flags in local_raylets()
            if os.path.realpath(flags.get("--temp_dir", "")) == wanted and flags.get("--gcs-address")]


def local_raylets() -> list[dict[str, str]]:
    """The ``--flag=value`` arguments of every raylet process on this machine."""
    import psutil

    raylets = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info["cmdline"] or []
        except psutil.Error:  # it ended, or is another user's
            continue
        if cmdline and Path(cmdline[0]).name == "raylet":
            raylets.append(dict(arg.split("=", 1) for arg in cmdline[1:]
                                if arg.startswith("--") and "=" in arg))
    return raylets


def dashboard_url(address: str) -> str | None:
    """The HTTP address of the cluster's dashboard (and Jobs API), None without one
    that answers."""
    from ray._private import ray_constants
    from ray._raylet import GcsClient  # pyright: ignore[reportAttributeAccessIssue] (not in Ray's stubs)

    url = GcsClient(address=address).internal_kv_get(
        ray_constants.DASHBOARD_ADDRESS.encode(), namespace=ray_constants.KV_NAMESPACE_DASHBOARD,
        timeout=PROBE_TIMEOUT_S)
    # a Ray started without its dashboard may still record where it would be
    return f"http://{url.decode()}" if url and accepts_connections(url.decode()) else None


def is_a_node_here(cluster_nodes: set[str], raylets: list[dict[str, str]]) -> bool:
    """Whether one of the cluster's nodes (hex ids) has its raylet on this machine: a
    driver joins a cluster through a raylet of its own machine (Ray would wait a
    minute for one before it fails).

        >>> is_a_node_here({"ab12"}, [{"--node_id": "ab12"}]), is_a_node_here({"ab12"}, [])
        (True, False)
    """
    return any(flags.get("--node_id") in cluster_nodes for flags in raylets)


def cluster_node_ids(address: str) -> set[str]:
    """The hex ids of the cluster's alive nodes, asked of its GCS (seconds at most)."""
    from ray._raylet import GcsClient  # pyright: ignore[reportAttributeAccessIssue] (not in Ray's stubs)
    from ray.core.generated.gcs_pb2 import GcsNodeInfo  # pyright: ignore[reportAttributeAccessIssue]

    nodes = GcsClient(address=address).get_all_node_info(
        timeout=PROBE_TIMEOUT_S, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    return {node_id.hex() for node_id in nodes}


def classify_keys(keys: list[bytes]) -> str:
    """A store with any key in raystream's namespace belongs to a raystream cluster."""
    return "raystream" if keys else "other"


def probe(address: str) -> Probe:
    """Ask the GCS at ``address`` for raystream's keys (a client of Ray's GCS only)."""
    from ray._raylet import GcsClient  # pyright: ignore[reportAttributeAccessIssue] (not in Ray's stubs)
    from ray.exceptions import AuthenticationError

    if not accepts_connections(address):
        return Probe(address, "silent", "nothing listens there")
    try:
        client = GcsClient(address=address)
        keys = client.internal_kv_keys(b"", namespace=KV_NAMESPACE.encode(),
                                       timeout=PROBE_TIMEOUT_S)
    except AuthenticationError as exc:
        return Probe(address, "refused", str(exc).split(". ")[0])
    except Exception as exc:
        return Probe(address, "silent", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    return Probe(address, classify_keys(list(keys)))


def accepts_connections(address: str) -> bool:
    """Whether ``host:port`` takes a TCP connection within a second."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
        return True
    except (OSError, ValueError):
        return False


def within(timeout_s: float, call: Callable[[], T]) -> T:
    """``call()``'s result, or TimeoutError when it takes longer than ``timeout_s``. (A
    daemon thread: a GCS client stuck on a server that never answers, say a port that
    is not a GCS, must not keep the command from exiting.)"""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True, name="raystream gcs call")
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise TimeoutError(f"no answer within {timeout_s:.0f} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def probe_all(addresses: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> list[Probe]:
    """Probe every address at once; one that has not answered within ``timeout_s`` is
    silent. (Daemon threads: a GCS client stuck on a hung server must not keep the
    command from exiting.)"""
    answers: dict[str, Probe] = {}

    def ask(address: str) -> None:
        answers[address] = probe(address)

    threads = [threading.Thread(target=ask, args=(a,), daemon=True, name=f"probe {a}")
               for a in addresses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, timeout_s))
    return [answers.get(a, Probe(a, "silent", f"no answer within {timeout_s:.0f} s"))
            for a in addresses]


def find_raystream_cluster() -> str:
    """The GCS address of the one raystream cluster on this machine, or
    :class:`ClusterNotFoundError` saying what runs here and how to name a cluster."""
    temp_dir = ray_temp_dir()
    use_token_if_available()
    probes = probe_all(candidates(temp_dir))
    ours = [p.address for p in probes if p.kind == "raystream"]
    if len(ours) == 1:
        return ours[0]
    raise ClusterNotFoundError(not_found_message(temp_dir, probes))


def not_found_message(temp_dir: Path, probes: list[Probe]) -> str:
    """One line: what was found in ``temp_dir`` and how to name the cluster.

        >>> not_found_message(Path("/tmp/ray"), [])
        'no Ray cluster runs on this machine (none in /tmp/ray): name the cluster with --address HOST:PORT or RAY_ADDRESS=HOST:PORT'
        >>> not_found_message(Path("/tmp/ray"), [Probe("127.0.0.1:6379", "other")])
        'no raystream cluster on this machine (the Ray at 127.0.0.1:6379 has never run raystream): name the cluster with --address HOST:PORT or RAY_ADDRESS=HOST:PORT'
    """
    ours = [p.address for p in probes if p.kind == "raystream"]
    if len(ours) > 1:
        return f"{len(ours)} raystream clusters run on this machine ({', '.join(ours)}): {HOW_TO_NAME}"
    if not probes:
        return f"no Ray cluster runs on this machine (none in {temp_dir}): {HOW_TO_NAME}"
    seen = "; ".join(_seen(p) for p in probes)
    return f"no raystream cluster on this machine ({seen}): {HOW_TO_NAME}"


def _seen(found: Probe) -> str:
    if found.kind == "other":
        return f"the Ray at {found.address} has never run raystream"
    if found.kind == "refused":
        return (f"the Ray at {found.address} refused this client: {found.detail}; set "
                f"RAY_AUTH_MODE=token and its token")
    return f"the Ray at {found.address} did not answer ({found.detail})"
