"""A job that cannot start as configured fails before Ray starts, in one line naming what
is wrong: a path read_files reads, the checkpoint storage, what it restores from, a Kafka
broker that does not answer (a closed loopback port) or a topic it does not have (a real
Kafka-protocol broker: Tansu, as in tests/test_kafka.py).

Each case runs in a fresh interpreter (this suite's own Ray is up already), which also
says whether Ray was started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import raystream as rs
from raystream.engine.preflight import runs_here

CASE = textwrap.dedent("""
    import sys, ray, raystream as rs
    kind, storage, path, restore_from, topic = sys.argv[1:6]
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=0.5, storage=storage) if storage else None)
    if kind == "files":
        env.read_files(path, format="csv").collect()
    elif kind == "kafka-source":
        sink = env.read_kafka(path, topics=[topic], bounded_until="latest",
                              value_format="raw").collect()
    elif kind == "kafka-sink":
        env.from_sequence(10).sink_to_kafka(path, topic)
    else:
        env.from_sequence(10).collect()
    try:
        result = env.execute("preflight", restore_from=restore_from or None)
        if kind == "kafka-source":
            print("READ", sorted(result.table(sink).column("value").to_pylist()))
    except rs.JobSetupError as exc:
        print("SETUP", exc)
    print("RAY", ray.is_initialized())
""")


def run_case(tmp_path, kind: str, *, storage: str = "", path: str = "",
             restore_from: str = "", topic: str = "") -> list[str]:
    """The case's lines on stdout. A job that did not start wrote nothing else (no
    librdkafka lines either); one that ran, no librdkafka line."""
    script = tmp_path / "case.py"
    script.write_text(CASE)
    ran = subprocess.run([sys.executable, str(script), kind, storage, path, restore_from, topic],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "RAYSTREAM_UI": "0"})
    assert ran.returncode == 0, ran.stderr
    if "RAY False" in ran.stdout:
        assert not ran.stderr.strip(), ran.stderr
    assert "rdkafka" not in ran.stderr, ran.stderr
    return ran.stdout.splitlines()


@pytest.mark.timeout(300)
def test_what_keeps_a_job_from_starting_is_named_before_ray_starts(tmp_path):
    missing = tmp_path / "no-such-dir"
    blocked = tmp_path / "a-file"
    blocked.write_text("where the checkpoint directory should be")
    empty = tmp_path / "not-a-savepoint"
    empty.mkdir()
    storage = str(tmp_path / "checkpoints")
    assert run_case(tmp_path, "files", path=str(missing)) == [
        f"SETUP read_files('{missing}'): {missing} does not exist", "RAY False"]
    lines = run_case(tmp_path, "sequence", storage=str(blocked / "checkpoints"))
    assert lines[0].startswith(f"SETUP CheckpointConfig(storage='{blocked}/checkpoints'): "
                               f"checkpoint storage {blocked}/checkpoints is not writable")
    assert "NotADirectoryError" in lines[0] and lines[1:] == ["RAY False"]
    lines = run_case(tmp_path, "sequence", storage=storage, restore_from=str(empty))
    assert lines == [f"SETUP restore_from='{empty}': no complete savepoint or checkpoint there "
                     f"(a savepoint's directory, or a job's checkpoint directory holding "
                     f"chk-<n> directories)", "RAY False"]


def test_a_job_on_a_cluster_leaves_the_checks_to_its_master():
    assert runs_here(None, environ={}) and runs_here("local", environ={})
    assert runs_here(None, environ={"RAY_ADDRESS": "127.0.0.1:6379"})
    assert not runs_here(None, environ={"RAY_ADDRESS": "10.1.2.3:6379"})
    assert not runs_here("ray://head:10001", environ={})
    # a Ray this process joined already decides: the embedded one is on loopback
    assert runs_here(None, environ={}, connected_gcs="127.0.0.1:6379")
    assert not runs_here(None, environ={}, connected_gcs="10.1.2.3:6379")
    assert not runs_here(None, environ={}, connected_gcs="")


def test_a_setup_error_is_a_value_error_of_raystream():
    assert issubclass(rs.JobSetupError, rs.RaystreamError)
    assert issubclass(rs.JobSetupError, ValueError)


@pytest.mark.timeout(600)
def test_a_kafka_broker_that_does_not_answer_or_a_missing_topic_is_named_before_ray_starts(
        tmp_path, broker):
    from tests.support.kafka import free_port

    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    for kind, call in [("kafka-source", f"read_kafka('{closed}', topics=['clicks'])"),
                       ("kafka-sink", f"sink_to_kafka('{closed}', 'clicks')")]:
        assert run_case(tmp_path, kind, path=closed, topic="clicks") == [
            f"SETUP {call}: no answer from the Kafka broker at {closed} within 5 s (Connect "
            f"to ipv4#{closed} failed: Connection refused): start it, or name the address it "
            f"listens on (and its security settings, such as security_protocol=...)",
            "RAY False"]
    topic = broker.topic(1, prefix="clicks")
    missing = topic + "x"
    assert run_case(tmp_path, "kafka-source", path=broker.bootstrap, topic=missing) == [
        f"SETUP read_kafka('{broker.bootstrap}', topics=['{missing}']): topic '{missing}' on "
        f"the Kafka broker at {broker.bootstrap} does not exist: create it (kafka-topics.sh "
        f"--create --topic {missing}) or name another (its topics: "
        f"{', '.join(sorted(broker.admin.list_topics(timeout=10).topics))}; did you mean "
        f"'{topic}'?)", "RAY False"]
    # a topic that is there passes, and the job reads what was produced
    values = [f"v{i}".encode() for i in range(25)]
    broker.produce(topic, 0, values)
    assert run_case(tmp_path, "kafka-source", path=broker.bootstrap, topic=topic) == [
        f"READ {sorted(values)!r}", "RAY True"]


@pytest.mark.timeout(600)
def test_a_sinks_missing_topic_is_created_by_a_broker_that_creates_topics(tmp_path, broker):
    """As a Flink KafkaSink's producer would on its first record: Tansu creates topics on
    demand, so the check passes and the job writes there (a broker that does not create
    them fails the check: test_a_missing_topic_names_the_topics_there)."""
    topic = f"created-{tmp_path.name}"[:60]
    assert topic not in broker.admin.list_topics(timeout=10).topics
    lines = run_case(tmp_path, "kafka-sink", storage=str(tmp_path / "checkpoints"),
                     path=broker.bootstrap, topic=topic)
    assert lines == ["RAY True"]
    written = broker.read(topic)
    assert sorted(json.loads(v)["id"] for v in written.value) == list(range(10))


def test_a_missing_topic_names_the_topics_there():
    """The message of a topic a broker has not (nor created), from its metadata."""
    from types import SimpleNamespace

    from raystream.engine.kafka_client import BrokerCheck

    check = BrokerCheck("sink_to_kafka('h:9092', 'total')", "h:9092", 10.0)
    metadata = SimpleNamespace(topics={"totals": None, "clicks": None, "__consumer_offsets": None})
    error = check.missing_topic("total", metadata, "does not exist, and the broker did not "
                                                   "create it (Broker: Unknown topic or partition)")
    assert str(error) == (
        "sink_to_kafka('h:9092', 'total'): topic 'total' on the Kafka broker at h:9092 does not "
        "exist, and the broker did not create it (Broker: Unknown topic or partition): create "
        "it (kafka-topics.sh --create --topic total) or name another (its topics: clicks, "
        "totals; did you mean 'totals'?)")
    assert isinstance(error, rs.JobSetupError)
