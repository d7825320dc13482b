"""Ray clusters of the multi-node tests' own: a `ray start --head` on loopback in its own
process group, and the guard that keeps ``ray.cluster_utils.Cluster`` from pointing every
``ray.init()`` on the machine at a test cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import ray._common.utils
import ray._private.utils
from ray._private import ray_constants

# Ray's single-machine mode, in this process and every Ray process it starts (the
# ray.cluster_utils.Cluster nodes): they all bind to and advertise 127.0.0.1. Ray reads the
# variable once, when imported (the main conftest imported it already).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray_constants.ENABLE_RAY_CLUSTER = False

VENV_BIN = Path(sys.executable).parent
HEAD_START_ATTEMPTS = 2
HEAD_START_TIMEOUT_S = 60


@contextlib.contextmanager
def machine_wide_ray_address_untouched():
    """``ray.cluster_utils.Cluster`` writes its address to Ray's machine-wide "current
    cluster" file, and deletes that file when it shuts down: meanwhile every plain
    ``ray.init()`` on this machine (other people's test runs) would connect to it. Within
    this block neither happens."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)
        patch.setattr(ray._common.utils, "reset_ray_address", lambda *args, **kwargs: None)
        yield


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@dataclass
class RayHead:
    """A Ray head node started with `ray start --head --block` in its own process group."""

    directory: Path
    gcs_address: str
    dashboard_url: str
    env: dict[str, str]  # for clients: loopback, token authentication, RAY_ADDRESS
    process: subprocess.Popen

    def run(self, *args: str, timeout: float = 120, env: dict | None = None
            ) -> subprocess.CompletedProcess:
        """Run a command (e.g. ``raystream list``) as a client of this cluster; ``env``
        overrides the client environment (None removes a variable)."""
        merged = {**self.env, **(env or {})}
        return subprocess.run(list(args), env={k: v for k, v in merged.items() if v is not None},
                              capture_output=True, text=True, timeout=timeout,
                              cwd=Path(__file__).parents[2])

    def stop(self) -> None:
        """Stop every process of this head (its process group), never any other Ray."""
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if self.process.poll() is not None and not _group_alive(self.process.pid):
                    return
                time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def start_ray_head(num_cpus: int = 2) -> RayHead:
    """A Ray head on loopback; a second try (new ports, new directory) if the first does
    not come up: on a loaded machine `ray start` can time out on its own GCS."""
    failures = []
    for _ in range(HEAD_START_ATTEMPTS):
        try:
            return _start_ray_head_once(num_cpus)
        except RuntimeError as e:
            failures.append(str(e))
    raise RuntimeError("\n\n".join(failures))


def _start_ray_head_once(num_cpus: int) -> RayHead:
    directory = Path(tempfile.mkdtemp(prefix="rs-head-", dir="/tmp"))  # short: socket paths
    from ray._private.authentication.authentication_token_generator import (
        generate_new_authentication_token)

    token = directory / "auth_token"
    token.write_text(generate_new_authentication_token())
    token.chmod(0o600)
    (gcs, dashboard, client, node_manager, object_manager, agent_listen, agent_grpc, metrics,
     runtime_env) = free_ports(9)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
        # Ray's single-machine mode: every Ray process binds to and uses 127.0.0.1
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PYSPARK_PYTHON": sys.executable,
    })
    command = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
               f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
               f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
               f"--dashboard-agent-listen-port={agent_listen}",
               f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
               f"--runtime-env-agent-port={runtime_env}", f"--temp-dir={directory / 'ray'}",
               f"--num-cpus={num_cpus}", "--object-store-memory=400000000",
               "--disable-usage-stats"]
    log = open(directory / "head.log", "w")
    process = subprocess.Popen(command, env={**env, "RAY_free_objects_period_milliseconds": "50"},
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    head = RayHead(directory, f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dashboard}",
                   {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}, process)
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if "This command will now block forever" in (directory / "head.log").read_text():
            return head
        time.sleep(0.5)
    head.stop()
    raise RuntimeError(f"ray start --head did not come up:\n{(directory / 'head.log').read_text()}")
