"""Local recovery (checkpoint/local_recovery.py): a subtask whose actor survives a failover
restores its own state from the copy its process kept of the newest completed checkpoint,
not from storage; every other case reads storage.

The copy is checked alone (what it keeps, when it drops it, which subtask it serves), and
in jobs on real Ray: a SIGKILL of one subtask of the exactly-once running sum
(tests/support/oracles.py), after which the survivor restored locally and the output is
exact; and a process exit in the middle of a checkpoint that the survivor had already
written (its state is ahead of the checkpoint the job goes back to), after which the
survivor restores the older checkpoint, locally, and the output is exact again.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import raystream as rs
from raystream.checkpoint.local_recovery import LocalStateCopy, SubtaskIdentity
from raystream.checkpoint.storage import StateHandle
from tests.support.pacing import Throttle

SUM = SubtaskIdentity("/c", "job", "sum", 0, range(0, 64))


def handle(n: int, name: str, data: bytes) -> StateHandle:
    return StateHandle(f"/c/job/chk-{n}/{name}", len(data), hashlib.sha256(data).hexdigest())


def checkpointed(copy: LocalStateCopy, n: int, files: dict[str, bytes],
                 also_needs: tuple[StateHandle, ...] = ()) -> list[StateHandle]:
    """The subtask wrote ``files`` for checkpoint ``n`` and acknowledged them (and
    ``also_needs``, files of earlier checkpoints, as a heap chain does)."""
    handles = [handle(n, name, data) for name, data in files.items()]
    for h, data in zip(handles, files.values()):
        copy.record(n, h, data)
    copy.acknowledged(n, [*handles, *also_needs])
    return handles


def test_the_copy_keeps_the_newest_completed_checkpoint_and_what_came_after():
    copy = LocalStateCopy()
    copy.bind(SUM)
    (one,) = checkpointed(copy, 1, {"sum-0.heap": b"full"})
    copy.completed(1)
    two = checkpointed(copy, 2, {"sum-0.op": b"op2", "sum-0.heap2": b"change"},
                       also_needs=(one,))
    assert copy.own_files(1) == {one.path}  # 2 has not completed: 1 is still served
    copy.completed(2)
    assert copy.own_files(2) == {one.path, *(h.path for h in two)}
    assert copy.own_files(1) is None  # one completed checkpoint at most
    (three,) = checkpointed(copy, 3, {"sum-0.op": b"op3"})
    copy.completed(3)
    # the chain file of checkpoint 1 is no longer needed by 3, and is gone
    assert copy.lookup(one) is None and copy.lookup(three) == b"op3"
    assert copy.size == len(b"op3")


def test_a_restore_drops_the_files_of_checkpoints_that_did_not_complete():
    """A survivor that wrote checkpoint 3 before the failure is ahead of checkpoint 2, the
    one the job goes back to: after the restore only 2's files are kept."""
    copy = LocalStateCopy()
    copy.bind(SUM)
    (two,) = checkpointed(copy, 2, {"sum-0.op": b"at 2"})
    copy.completed(2)
    (ahead,) = checkpointed(copy, 3, {"sum-0.op": b"at 3"})
    assert copy.lookup(ahead) == b"at 3"
    copy.restored(2, local=True)
    assert copy.lookup(ahead) is None and copy.lookup(two) == b"at 2"
    assert copy.own_files(2) == {two.path} and copy.own_files(3) is None
    copy.restored(2, local=False)  # a restore that read storage keeps nothing
    assert copy.lookup(two) is None and copy.own_files(2) is None


def test_a_restore_from_storage_keeps_the_chain_the_next_checkpoint_extends():
    """What a restore read from storage and the next checkpoints need (a heap chain they
    extend) is kept; a restore of the same checkpoint again still reads storage, and once a
    checkpoint that extends the chain completes, it is served whole from the copy."""
    copy = LocalStateCopy()
    copy.bind(SUM)
    full, op = handle(2, "sum-0.heap", b"full"), handle(2, "sum-0.op", b"op2")
    copy.restored(2, local=False, read=[(full, b"full")])
    assert copy.own_files(2) is None and copy.lookup(op) is None
    copy.record(2, op, b"op2")  # a late write of checkpoint 2 (an old attempt's): not kept
    assert copy.lookup(op) is None
    three = checkpointed(copy, 3, {"sum-0.op": b"op3", "sum-0.heap3": b"changes"},
                         also_needs=(full,))
    copy.completed(3)
    assert copy.own_files(3) == {full.path, *(h.path for h in three)}
    assert copy.lookup(full) == b"full"


def test_only_the_same_subtask_at_the_same_key_groups_is_served():
    """A rescaled subtask (other key groups), another chain, index or job drops the copy;
    a handle whose checksum differs from the kept file's is never served."""
    for other in (SubtaskIdentity("/c", "job", "sum", 0, range(0, 43)),  # p=2 -> p=3
                  SubtaskIdentity("/c", "job", "sum", 1, range(0, 64)),
                  SubtaskIdentity("/c", "other-job", "sum", 0, range(0, 64)),
                  SubtaskIdentity("/c", "job", "count", 0, range(0, 64))):
        copy = LocalStateCopy()
        copy.bind(SUM)
        (kept,) = checkpointed(copy, 1, {"sum-0.op": b"state"})
        copy.completed(1)
        copy.bind(SUM)  # the same subtask again (the next attempt): kept
        assert copy.lookup(kept) == b"state"
        assert copy.lookup(StateHandle(kept.path, kept.size, "0" * 64)) is None
        copy.bind(other)
        assert copy.lookup(kept) is None and copy.own_files(1) is None, other


# -- jobs ------------------------------------------------------------------------------------

def running_sum(env: rs.StreamEnvironment) -> rs.SinkHandle:
    from tests.support.functions import RunningSum
    from tests.support.inputs import N, SPLITS, numbers

    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    return source.map_batches(Throttle(0.03), name="throttle").key_by("k").process(
        RunningSum("heap"), name="sum").collect(name="out")


def restored_from(result, chain_prefix: str) -> dict[str, str]:
    (recovery,) = result.restores
    return {name: origin for name, origin in recovery["restored_from"].items()
            if name.startswith(chain_prefix)}


def test_a_survivor_of_a_sigkill_restores_its_state_locally(ray_session, tmp_path):
    import ray

    from tests.support.jobs import checkpointed_env, wait_for_checkpoint
    from tests.support.oracles import assert_exactly_once

    env = checkpointed_env(str(tmp_path / "chk"))
    sink = running_sum(env)
    client = env.execute_async("local-recovery-kill")
    completed = wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    survivor = client.subtask_actor("sum", 0)
    assert ray.get(survivor.local_copy_bytes.remote(), timeout=30) > 0
    pid = ray.get(client.subtask_actor("sum", 1).metrics.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    result = client.wait(timeout_s=240)
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] >= completed
    sums = restored_from(result, "sum")
    # the survivor from its process's copy; the killed one's replacement from storage
    assert sums == {"sum -> out[0]": "local", "sum -> out[1]": "storage"}, result.restores
    assert all(origin == "local" for name, origin in result.restores[0]["restored_from"].items()
               if not name.startswith("sum")), result.restores  # the sources' actors lived
    assert_exactly_once(result.table(sink))
    # the job is over: its actor went back to the driver's pool, holding no copy of it
    assert poll(lambda: ray.get(survivor.local_copy_bytes.remote(), timeout=30) == 0)


def test_a_subtask_that_restored_from_storage_restores_locally_at_the_next_failure(
        ray_session, tmp_path):
    """The replacement of a killed ``sum[1]`` restores from storage; its next checkpoints
    extend the heap chain it read (their state still names those files), so a kill of
    ``sum[0]`` after one of them finds all of ``sum[1]``'s files in its copy: it restores
    locally (before, only what it wrote since was there, and it read storage again). Every
    checkpoint extends its chain here (no full snapshot resets it)."""
    from tests.support.jobs import checkpointed_env, subtask_pid, wait_for_checkpoint
    from tests.support.oracles import assert_exactly_once

    env = checkpointed_env(str(tmp_path / "chk"),
                           state_backend=rs.HeapStateOptions(max_changes_ratio=1000.0))
    sink = running_sum(env)
    client = env.execute_async("local-recovery-after-storage")
    before = wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    os.kill(subtask_pid(client, "sum", 1), signal.SIGKILL)
    # two checkpoints of the next attempt (none of the first can complete after the kill)
    wait_for_checkpoint(client, after=wait_for_checkpoint(client, after=before))
    os.kill(subtask_pid(client, "sum", 0), signal.SIGKILL)
    result = client.wait(timeout_s=240)
    assert result.restarts == 2, result.failures
    first, second = ({name: origin for name, origin in r["restored_from"].items()
                      if name.startswith("sum")} for r in result.restores)
    assert first == {"sum -> out[0]": "local", "sum -> out[1]": "storage"}, result.restores
    assert second == {"sum -> out[0]": "storage", "sum -> out[1]": "local"}, result.restores
    assert_exactly_once(result.table(sink))


def poll(condition, timeout_s: float = 60.0) -> bool:
    """True once ``condition()`` holds (False if it never did within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_survivor_ahead_of_the_checkpoint_restores_the_completed_one(ray_session, tmp_path):
    """``sum[1]``'s process ends at the start of its write of the third checkpoint, which
    so never completes; ``sum[0]`` took that checkpoint too (its state and copy were
    ahead of the second). It restores the second from its copy, and nothing it processed
    after that checkpoint counts twice."""
    from tests.support.jobs import checkpointed_env
    from tests.support.oracles import assert_exactly_once

    env = checkpointed_env(str(tmp_path / "chk"), failpoints=[
        rs.Failpoint("in_async_write", operator="sum", subtask=1, hit=3)])
    sink = running_sum(env)
    result = env.execute("local-recovery-ahead")
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] == 2, result.restores
    assert restored_from(result, "sum") == {"sum -> out[0]": "local", "sum -> out[1]": "storage"}
    assert_exactly_once(result.table(sink))


def test_a_subtask_that_raised_restores_locally_on_its_live_actor(ray_session, tmp_path):
    """A subtask that raises leaves its actor alive, and the next attempt is hosted on it:
    it restores from the copy too (of the checkpoint, not of the state it had when it
    raised), as does every other subtask."""
    from tests.support.jobs import checkpointed_env
    from tests.support.oracles import assert_exactly_once

    env = checkpointed_env(str(tmp_path / "chk"), failpoints=[
        rs.Failpoint("in_processing", operator="sum", subtask=0, hit=80, action="raise")])
    sink = running_sum(env)
    result = env.execute("local-recovery-raise")
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] is not None, result.restores
    assert set(result.restores[0]["restored_from"].values()) == {"local"}, result.restores
    assert_exactly_once(result.table(sink))
