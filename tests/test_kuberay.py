"""kuberay/rayjob.yaml: what Ray owns in it passes Ray's own checks (the version, the
`ray start` options, the runtime environment), its entrypoint is a raystream command
that parses, and the job script it mounts runs and gives pandas' answer. No Kubernetes
here: KubeRay's CRD schema does not install from PyPI, so its fields are checked against
KubeRay's API reference by hand (the structure a RayJob must have)."""

from __future__ import annotations

import runpy
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray
import yaml
from ray.runtime_env import RuntimeEnv
from ray.scripts.scripts import start

from raystream.engine.cli import build_parser
from raystream.spark.commit_log import read_committed

MANIFEST = Path(__file__).resolve().parents[1] / "kuberay" / "rayjob.yaml"


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def test_the_rayjob_is_shaped_as_kuberay_reads_it(manifest):
    job = manifest["RayJob"]
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"]
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}  # token authentication stays on
    head = cluster["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["name"] == "ray-head"
    for group in cluster["workerGroupSpecs"]:
        assert group["groupName"] and group["template"]["spec"]["containers"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_what_ray_owns_passes_rays_checks(manifest):
    cluster = manifest["RayJob"]["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__  # the Ray raystream is built against
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    options = {param.name for param in start.params}
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            assert container["image"] == f"rayproject/ray:{ray.__version__}-{python}"
        # KubeRay turns each key into `ray start --<key>`
        unknown = {key for key in group["rayStartParams"] if key.replace("-", "_") not in options}
        assert not unknown, f"not options of ray start: {unknown}"
    runtime_env = yaml.safe_load(manifest["RayJob"]["spec"]["runtimeEnvYAML"])
    RuntimeEnv(**runtime_env)  # Ray's own validation of a job's runtime environment
    assert "raystream" in runtime_env["pip"]


def test_the_entrypoint_runs_the_mounted_script_with_raystream(manifest):
    words = shlex.split(manifest["RayJob"]["spec"]["entrypoint"])
    assert words[0] == "raystream" and "--" in words  # the script's arguments after --
    args = build_parser().parse_args(words[1:words.index("--")])  # as `raystream` parses
    assert args.command == "run"
    head = manifest["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = head["containers"][0]["volumeMounts"][0]
    assert head["volumes"][0]["configMap"]["name"] == manifest["ConfigMap"]["metadata"]["name"]
    assert Path(args.script).parent == Path(mount["mountPath"])
    assert Path(args.script).name in manifest["ConfigMap"]["data"]


def test_the_job_script_counts_clicks_per_user_and_minute_exactly_once(
        manifest, ray_session, tmp_path, monkeypatch):
    script = tmp_path / "clicks.py"
    script.write_text(manifest["ConfigMap"]["data"]["clicks.py"])
    rows, out = 30_000, tmp_path / "out"
    monkeypatch.setattr(sys, "argv", [str(script), "--out", str(out), "--checkpoints",
                                      str(tmp_path / "checkpoints"), "--rows", str(rows)])
    namespace = runpy.run_path(str(script), run_name="__main__")
    i = np.arange(rows)
    clicks = pd.DataFrame(namespace["clicks"](i))
    expected = clicks.assign(window_start=clicks.ts // 60_000 * 60_000).groupby(
        ["user", "window_start"]).size().rename("count")
    got = read_committed(str(out)).to_pandas().set_index(["user", "window_start"])["count"]
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_dtype=False)
