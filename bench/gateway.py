"""Operator events: round-trip latency with and without checkpoints, and how long a
checkpoint holds them (FLINK-26029's gateway).

The job, parallelism 2: ``add_source(PingPong, coordinator=Echo) -> collect()``.

* ``PingPong`` (a source) sends a ping to its coordinator and, as soon as the
  answer arrives, the next one, for ``--duration`` seconds; it records each
  round trip (subtask -> job master -> subtask: two Ray calls, the mailbox of
  each side) and emits the figures as rows at the end.
* ``Echo`` (its coordinator) answers every ping at once. Right after each of
  its checkpoint snapshots it also sends a *marker* stamped with the time:
  the gateway holds it until the subtask has taken its own synchronous
  snapshot, so the marker's delay is how long that checkpoint held events.

Runs, in the same Ray session: without checkpoints (``passthrough``), then
with a checkpoint every ``--interval`` seconds (``checkpointing``). Beside
them, the floor: a bare round trip of two Ray actor calls between two actors
(``ray``). Prints p50/p99 of each and the median hold per checkpoint; the
last line::

    RESULT held_ms_p50=<ms> passthrough_us_p50=<us> passthrough_over_ray=<ratio>

    ./dev bench bench/gateway.py                    # 10 s per run
    ./dev bench bench/gateway.py --duration 3       # quicker
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray

import raystream as rs


class Echo(rs.OperatorCoordinator):
    def __init__(self, context: rs.OperatorCoordinatorContext) -> None:
        self.context = context

    def handle_event_from_subtask(self, subtask: int, event: tuple) -> None:
        self.context.send_event(subtask, event)

    def checkpoint_coordinator(self, checkpoint_id: int) -> bytes:
        # Scheduled, so it is sent after the snapshot: held until each subtask's own.
        self.context.call_later(0.0, lambda: self._markers(checkpoint_id))
        return b""

    def _markers(self, checkpoint_id: int) -> None:
        for subtask in range(self.context.parallelism):
            self.context.send_event(subtask, ("marker", time.time()))


class PingPong(rs.SourceOperator):
    duration_s = 10.0

    def open(self) -> None:
        self.until = time.monotonic() + self.duration_s
        self.rtt_us: list[float] = []
        self.held_ms: list[float] = []
        self.done = False
        self._ping()

    def _ping(self) -> None:
        self.ctx.send_event_to_coordinator(("ping", time.perf_counter()))

    def handle_operator_event(self, event: tuple) -> None:
        kind, stamp = event
        if kind == "marker":
            self.held_ms.append((time.time() - stamp) * 1000)
            return
        self.rtt_us.append((time.perf_counter() - stamp) * 1e6)
        if time.monotonic() < self.until:
            self._ping()
        else:
            self.done = True

    def is_available(self) -> bool:
        return self.done

    def emit_next(self) -> bool:
        if self.done and (self.rtt_us or self.held_ms):
            self.output.emit(pa.record_batch({
                "kind": ["rtt"] * len(self.rtt_us) + ["held"] * len(self.held_ms),
                "value": pa.array(self.rtt_us + self.held_ms, pa.float64())}))
            self.rtt_us, self.held_ms = [], []
            return True
        return not self.done


def run(duration_s: float, interval_s: float | None) -> tuple[np.ndarray, np.ndarray, int]:
    with tempfile.TemporaryDirectory() as storage:
        checkpoints = (rs.CheckpointConfig(interval_s=interval_s, storage=storage)
                       if interval_s else None)
        env = rs.StreamEnvironment(parallelism=2, checkpoints=checkpoints)
        source = type("TimedPingPong", (PingPong,), {"duration_s": duration_s})
        sink = env.add_source(source, name="ping", coordinator=Echo).collect()
        result = env.execute("gateway-bench")
        table = result.table(sink)
        kinds = np.array(table["kind"].to_pylist())
        values = table["value"].to_numpy()
        completed = sum(c.status == "COMPLETED" for c in result.checkpoints)
        return values[kinds == "rtt"], values[kinds == "held"], completed


@ray.remote(num_cpus=0)
class Bouncer:
    def __init__(self, peer=None) -> None:
        self.peer = peer

    def bounce(self, stamp: float) -> float:
        return stamp if self.peer is None else ray.get(self.peer.bounce.remote(stamp))


def ray_round_trip(duration_s: float) -> np.ndarray:
    """The floor: a call to an actor that calls another actor and returns."""
    far = Bouncer.remote()
    near = Bouncer.remote(far)
    ray.get(near.bounce.remote(0.0))
    rtts = []
    until = time.monotonic() + duration_s
    while time.monotonic() < until:
        started = time.perf_counter()
        ray.get(near.bounce.remote(started))
        rtts.append((time.perf_counter() - started) * 1e6)
    return np.array(rtts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--interval", type=float, default=0.5, help="checkpoint interval (s)")
    args = parser.parse_args()
    rs.StreamEnvironment(parallelism=1)  # starts Ray (not timed)
    floor = ray_round_trip(args.duration)
    passthrough, _, _ = run(args.duration, None)
    checkpointed, held, completed = run(args.duration, args.interval)
    if completed < 3 or held.size == 0:
        raise SystemExit(f"invalid: {completed} checkpoints completed, {held.size} held markers")
    print(f"parallelism 2, {args.duration:g} s per run, checkpoint every {args.interval:g} s")
    print(f"{'run':<16}{'round trips':>12}{'p50 us':>10}{'p99 us':>10}")
    for name, values in (("ray (2 calls)", floor), ("passthrough", passthrough),
                         ("checkpointing", checkpointed)):
        print(f"{name:<16}{values.size:>12,}{np.percentile(values, 50):>10.0f}"
              f"{np.percentile(values, 99):>10.0f}")
    print(f"held per checkpoint: {completed} checkpoints, {held.size} markers, "
          f"p50 {np.percentile(held, 50):.1f} ms, max {held.max():.1f} ms")
    ratio = np.percentile(passthrough, 50) / np.percentile(floor, 50)
    print(f"RESULT held_ms_p50={np.percentile(held, 50):.2f} "
          f"passthrough_us_p50={np.percentile(passthrough, 50):.0f} passthrough_over_ray={ratio:.2f}")


if __name__ == "__main__":
    main()
