"""The embedded local default serves this machine only: every process it starts (Ray's
GCS, raylet, agents and workers, RayDP's Spark master and executors, Spark's JVM) listens
on loopback, and token authentication stays on."""

from __future__ import annotations

import ipaddress

import psutil
import ray
from ray._private.authentication.authentication_utils import is_token_auth_enabled

import raystream as rs


def listening_sockets() -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of this process and
    the processes it started, directly or not."""
    me = psutil.Process()
    found = []
    for process in [me, *me.children(recursive=True)]:
        try:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((process.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:  # a worker that ended meanwhile
            continue
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_every_service_of_the_embedded_default_listens_on_loopback_only(spark):
    env = rs.StreamEnvironment(parallelism=2)
    out = env.from_collection([{"x": i} for i in range(10)]).map(lambda r: r).collect()
    assert env.execute("loopback").table(out).num_rows == 10
    assert spark.range(5).count() == 5

    sockets = listening_sockets()
    names = {name for name, _, _ in sockets}
    assert "gcs_server" in names and "raylet" in names and "java" in names  # the oracle saw them
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert is_token_auth_enabled()
