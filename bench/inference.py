"""Model pools and async calls: raystream beside Ray Data in the same run, and ``map_async``
beside Little's law.

* **Pool**: the same model (a numpy MLP, 64 -> 256 -> 256 -> 10, float32, a few ms a
  batch), the same pool (``--actors`` actors of ``--actor-cpus`` CPUs each), the same
  bounded data (``--rows`` rows of 64 features, batches of ``--batch-size``) through
  (a) raystream's ``map_batches(MLP, concurrency=actors)`` from ``from_arrow`` at
  parallelism 1, into a discard sink, without checkpoints, and (b) Ray Data's
  ``map_batches(MLP, concurrency=actors)`` on ``from_arrow``, materialized. Each side is
  timed end to end (actors' start included) and counted: both must have seen every row.
  ``pool_over_ray_data`` is raystream's rows/s over Ray Data's (target >= 0.8).
* **Async**: ``map_async`` at ``capacity=100`` per subtask, ``--async-parallelism``
  subtasks, against an aiohttp service on loopback answering each request after 50 ms.
  Little's law bounds it at ``parallelism * capacity / 50 ms`` rows/s;
  ``async_of_littles_law`` is the rate reached over that bound (target >= 0.8).

    ./dev bench bench/inference.py
    ./dev bench bench/inference.py --quick     # smoke check: small inputs

Last line::

    RESULT pool_over_ray_data=<r> async_rows_per_s=<n> async_of_littles_law=<r>
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time

import numpy as np
import pyarrow as pa

import raystream as rs

FEATURES = 64
LATENCY_S = 0.05
CAPACITY = 100


class MLP:
    """The model of both sides: fixed random weights (seeded), ReLU, argmax."""

    def __init__(self) -> None:
        rng = np.random.default_rng(7)
        self.layers = [rng.standard_normal((a, b)).astype(np.float32) / np.sqrt(a)
                       for a, b in ((FEATURES, 256), (256, 256), (256, 10))]

    def __call__(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        # Ray Data passes a Table (chunked columns), raystream a RecordBatch
        x, ids = (c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                  for c in (batch["features"], batch["id"]))
        h = x.flatten().to_numpy().reshape(-1, FEATURES)
        for w in self.layers[:-1]:
            h = np.maximum(h @ w, 0)
        # a Table: what both accept (Ray Data takes no RecordBatch)
        return pa.table({"id": ids, "label": np.argmax(h @ self.layers[-1], 1)})


def data(rows: int) -> pa.Table:
    features = np.random.default_rng(1).standard_normal(rows * FEATURES).astype(np.float32)
    return pa.table({"id": np.arange(rows),
                     "features": pa.FixedSizeListArray.from_arrays(pa.array(features), FEATURES)})


def raystream_rate(table: pa.Table, args: argparse.Namespace) -> float:
    env = rs.StreamEnvironment(parallelism=1)
    scored = env.from_arrow(table, batch_size=args.batch_size, num_splits=1).map_batches(
        MLP, concurrency=args.actors, num_cpus=args.actor_cpus, name="mlp")
    sink = scored.map_batches(lambda b: pa.record_batch({"n": [b.num_rows]})).collect()
    started = time.perf_counter()
    result = env.execute("bench-inference-pool")
    elapsed = time.perf_counter() - started
    seen = int(np.sum(result.table(sink)["n"].to_numpy()))
    assert seen == table.num_rows, f"raystream scored {seen} of {table.num_rows} rows"
    return table.num_rows / elapsed


def ray_data_rate(table: pa.Table, args: argparse.Namespace) -> float:
    import ray.data

    started = time.perf_counter()
    ds = ray.data.from_arrow(table).map_batches(
        MLP, concurrency=args.actors, num_cpus=args.actor_cpus, batch_size=args.batch_size,
        batch_format="pyarrow").materialize()
    elapsed = time.perf_counter() - started
    seen = ds.count()
    assert seen == table.num_rows, f"Ray Data scored {seen} of {table.num_rows} rows"
    return table.num_rows / elapsed


class Service:
    """An aiohttp service on a free loopback port answering ``/<i>`` after 50 ms."""

    def __enter__(self) -> str:
        from aiohttp import web

        async def answer(request):
            await asyncio.sleep(LATENCY_S)
            return web.json_response({"i": int(request.match_info["i"])})

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/{i}", answer)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", port,
                                                 backlog=1024).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Caller:
    """``map_async``'s function: one request per row over a session kept per subtask."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.session = None

    async def __call__(self, row: dict) -> dict:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=CAPACITY))
        async with self.session.get(f"{self.address}/{row['id']}") as reply:
            return {"id": (await reply.json())["i"]}


def async_rate(rows: int, parallelism: int) -> float:
    with Service() as address:
        env = rs.StreamEnvironment(parallelism=parallelism)
        answered = env.from_sequence(rows, lambda i: {"id": i}, batch_size=1000).map_async(
            Caller(address), capacity=CAPACITY, name="call")
        sink = answered.map_batches(lambda b: pa.record_batch({"n": [b.num_rows]})).collect()
        result = env.execute("bench-inference-async")
        seen = int(np.sum(result.table(sink)["n"].to_numpy()))
        assert seen == rows, f"map_async answered {seen} of {rows} rows"
        return rows / result.run_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--actor-cpus", type=float, default=0.5)
    parser.add_argument("--async-rows", type=int, default=40_000)
    parser.add_argument("--async-parallelism", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.async_rows = 40_000, 4_000

    from raystream.core.ray_start import ensure_ray

    ensure_ray()
    table = data(args.rows)
    ours = raystream_rate(table, args)
    print(f"pool: raystream map_batches {ours:,.0f} rows/s")
    theirs = ray_data_rate(table, args)
    print(f"pool: Ray Data map_batches {theirs:,.0f} rows/s")
    rate = async_rate(args.async_rows, args.async_parallelism)
    bound = args.async_parallelism * CAPACITY / LATENCY_S
    print(f"async: {rate:,.0f} rows/s of Little's law's {bound:,.0f}")
    print(f"RESULT pool_over_ray_data={ours / theirs:.3f} async_rows_per_s={rate:.0f} "
          f"async_of_littles_law={rate / bound:.3f}")


if __name__ == "__main__":
    main()
