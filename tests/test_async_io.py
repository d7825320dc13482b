"""Async I/O (``map_async``, engine/operators/async_io.py): calls in flight, in order or
not but never across a watermark, timeouts, retries, backpressure, and exactly one
result per input through snapshots, restores at other parallelisms and a SIGKILL.

Oracle: the input itself (numpy): every input's result (``x * 2`` with its ``i``) is in
the output exactly once; in ordered mode in input order; in unordered mode no result
of an input before a watermark comes after it, nor one of an input after it before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import random
import socket
import threading

import numpy as np
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.actors.operator import RestoredState, RuntimeContext
from raystream.engine.operators.async_io import AsyncWaitOperator
from raystream.engine.operators.async_queue import AsyncQueue
from tests.support.docs import example
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.pacing import Throttle


class Recording:
    """An output keeping batches and watermarks in the order they came."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.events.extend(("row", row) for row in batch.to_pylist())

    def emit_watermark(self, watermark: int) -> None:
        self.events.append(("watermark", watermark))

    def rows(self) -> list[dict]:
        return [value for kind, value in self.events if kind == "row"]  # type: ignore[misc]


class Doubling:
    """``async`` x * 2 after a random sleep (seeded per row), counting the calls in flight."""

    def __init__(self, max_ms: float = 8.0) -> None:
        self.max_ms = max_ms
        self.in_flight = self.most = 0
        self.lock = threading.Lock()

    async def __call__(self, row: dict) -> dict:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(random.Random(row["i"]).uniform(0, self.max_ms) / 1000)
            return {"i": row["i"], "y": row["x"] * 2}
        finally:
            with self.lock:
                self.in_flight -= 1


def operator(fn, *, index: int = 0, parallelism: int = 1, restored=None, **options):
    op = AsyncWaitOperator("enrich", fn, **options)
    out = Recording()
    op.setup(RuntimeContext("job", "enrich", index, parallelism, 128, 0), out)
    op.initialize_state(restored)
    op.open()
    return op, out


def batches(n: int, size: int) -> list[pa.RecordBatch]:
    i = np.arange(n)
    return [pa.record_batch({"i": i[a:a + size], "x": i[a:a + size] * 10})
            for a in range(0, n, size)]


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_results_in_order_or_within_their_watermarks(ordered):
    fn = Doubling()
    op, out = operator(fn, capacity=16, ordered=ordered)
    n, size = 300, 20
    for k, batch in enumerate(batches(n, size)):
        op.process_batch(batch)
        if k % 3 == 2:
            op.process_watermark(k)  # after the rows of batches 0..k
    op.finish()
    op.close()
    rows = out.rows()
    assert sorted(r["i"] for r in rows) == list(range(n))  # each input once
    assert all(r["y"] == r["i"] * 20 for r in rows)
    assert fn.most <= 16  # never more calls in flight than the capacity
    if ordered:
        assert [r["i"] for r in rows] == list(range(n))
    # a watermark k follows every row of batches 0..k and precedes every later one
    seen: set[int] = set()
    for kind, value in out.events:
        if kind == "row":
            seen.add(value["i"])  # type: ignore[index]
        else:
            assert seen == set(range((int(value) + 1) * size)), value  # type: ignore[arg-type]
    assert [v for kind, v in out.events if kind == "watermark"] == list(range(2, n // size, 3))


def test_a_call_that_times_out_fails_naming_the_record_or_goes_to_on_timeout():
    async def slow_for_seven(row):
        await asyncio.sleep(5 if row["i"] == 7 else 0)
        return {"i": row["i"]}

    op, _ = operator(slow_for_seven, capacity=4, timeout_s=0.2)
    with pytest.raises(rs.AsyncTimeoutError, match=r"map_async 'enrich': no result within "
                                                   r"0.2 s for record \{'i': 7, 'x': 70\}"):
        op.process_batch(batches(10, 10)[0])
        op.finish()
    op.close()
    op, out = operator(slow_for_seven, capacity=4, timeout_s=0.2,
                       on_timeout=lambda row: {"i": row["i"], "timed_out": True})
    op.process_batch(batches(10, 10)[0])
    op.finish()
    op.close()
    assert [r["i"] for r in out.rows()] == list(range(10))
    assert [r["i"] for r in out.rows() if r.get("timed_out")] == [7]
    assert op.metrics()["async_timeouts"] == 1


def test_retries_with_backoff_for_the_exceptions_named_and_fails_on_others():
    calls: dict[int, int] = {}

    async def flaky(row):
        calls[row["i"]] = calls.get(row["i"], 0) + 1
        if calls[row["i"]] < 3:
            raise ConnectionError(f"refused ({calls[row['i']]})")
        return {"i": row["i"]}

    retry = rs.AsyncRetry(attempts=3, backoff_s=0.001, on=(ConnectionError,))
    op, out = operator(flaky, retry=retry)
    op.process_batch(batches(5, 5)[0])
    op.finish()
    op.close()
    assert [r["i"] for r in out.rows()] == list(range(5)) and set(calls.values()) == {3}
    assert op.metrics()["async_retries"] == 10
    calls.clear()
    op, _ = operator(flaky, retry=rs.AsyncRetry(attempts=2, backoff_s=0.001,
                                                on=(ConnectionError,)))
    with pytest.raises(ConnectionError, match=r"refused \(2\)") as raised:
        op.process_batch(batches(5, 5)[0])
        op.finish()
    op.close()
    assert any("record: {'i': " in note for note in raised.value.__notes__)


def test_snapshot_keeps_the_inputs_without_results_and_restores_at_other_parallelisms():
    """Midway, with calls in flight: the rows emitted before the snapshot and those the
    restored subtasks emit (1 or 3 of them) are every input exactly once."""
    fn = Doubling(max_ms=30)
    n = 200
    op, out = operator(fn, capacity=50, ordered=False)
    parts = batches(n, 25)
    for batch in parts[:4]:
        op.process_batch(batch)
    op.prepare_snapshot_pre_barrier(1)
    state = op.snapshot_state(1).operator_state
    assert state is not None
    before = [r["i"] for r in out.rows()]
    snapshot = state()
    pending = n // 2 - len(before)
    assert pending > 0  # calls were in flight
    op.close()
    for parallelism in (1, 3):
        got = list(before)
        for index in range(parallelism):
            # union state: every subtask is given every old subtask's state
            restored = RestoredState(1, [snapshot])
            again, out_again = operator(Doubling(), index=index, parallelism=parallelism,
                                        restored=restored)
            for batch in parts[4:][index::parallelism]:
                again.process_batch(batch)
            again.finish()
            again.close()
            got += [r["i"] for r in out_again.rows()]
        assert sorted(got) == list(range(n)), parallelism


def test_batches_are_one_call_each():
    async def total(batch: pa.RecordBatch):
        return pa.record_batch({"total": [int(np.sum(batch["x"].to_numpy()))]})

    op, out = operator(total, batch=True)
    for batch in batches(100, 30):
        op.process_batch(batch)
    op.finish()
    op.close()
    want = [int(b["x"].to_numpy().sum()) for b in batches(100, 30)]
    assert [r["total"] for r in out.rows()] == want


def test_map_async_needs_an_async_function_when_the_job_is_built():
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(TypeError, match=r"map_async\(fn\): the function must be an "
                                        "`async def`"):
        env.from_sequence(10).map_async(lambda row: row)


def test_the_queue_lets_a_newer_watermark_replace_one_with_nothing_between():
    q = AsyncQueue(ordered=False)
    q.add_watermark(1)
    q.add_watermark(2)
    e = q.add("a")
    q.add_watermark(3)
    assert [type(x).__name__ for x in q.ready()] == ["Watermark"]  # 2 (1 replaced)
    q.complete(e, ["A"])
    assert [getattr(x, "watermark", None) or x.rows for x in q.ready()] == [["A"], 3]


# -- a job through a kill ---------------------------------------------------------------------

N = 6_000
throttle = Throttle(0.05)  # 30 batches a split: 1.5 s of input, running at the kill


async def doubled(row: dict) -> dict:
    await asyncio.sleep(random.Random(row["i"]).uniform(0, 5) / 1000)
    return {"i": row["i"], "y": row["x"] * 2}


def test_a_map_async_job_gives_every_input_one_result_through_a_kill(ray_session, tmp_path):
    env = checkpointed_env(str(tmp_path))
    src = env.from_sequence(N, lambda i: {"i": i, "x": i * 10}, batch_size=100,
                            num_splits=2).map_batches(throttle, name="throttle")
    sink = src.map_async(doubled, capacity=32, ordered=False, name="enrich").collect()
    client = env.execute_async("map-async-kill")
    completed = wait_for_checkpoint(client, after=1)
    ray.kill(client.subtask_actor("enrich", 1))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] >= completed
    got = result.table(sink).to_pandas().sort_values("i").reset_index(drop=True)
    assert got["i"].tolist() == list(range(N))  # every input once: nothing lost, nothing twice
    assert (got["y"] == got["i"] * 20).all()


# -- the guide's example, against a service on loopback -----------------------------------------

@contextlib.contextmanager
def tier_service(slow_user: int):
    """An aiohttp service on a free loopback port: ``/users/<u>`` answers
    ``{"tier": "gold" | "silver"}``, for ``slow_user`` only after 10 s."""
    from aiohttp import web

    async def user(request):
        u = int(request.match_info["u"])
        if u == slow_user:
            await asyncio.sleep(10)
        return web.json_response({"tier": "gold" if u % 3 == 0 else "silver"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/users/{u}", user)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def test_the_guides_example_enriches_rows_from_a_local_service(ray_session):
    code = example(pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide.md",
                   "## Calling services")
    with tier_service(slow_user=13) as address:
        namespace: dict = {}
        exec(compile(code.replace("http://127.0.0.1:8080", address), "docs/guide.md", "exec"),
             namespace)
    got = sorted(namespace["result"].table(namespace["tiers"]).to_pylist(),
                 key=lambda row: row["user"])
    want = [{"user": u, "ts": 1_000 * u,
             "tier": None if u == 13 else "gold" if u % 3 == 0 else "silver"}
            for u in range(20)]  # user 13's call timed out: on_timeout's row instead
    assert got == want
