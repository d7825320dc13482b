"""The subtask actors of a job's current attempt: placing, wiring, pinging, releasing them.

A :class:`Deployment` lives in the job master and is driven by its event
thread. Each attempt is deployed on the actors of the previous one where they
are still alive (``host``: no new process to start), on the driver's pooled
actors for the first attempt, on a warm spare, and on new actors for the
rest; subtasks are spread over the cluster's nodes and kept off nodes that
seem lost. Every Ray call the job master makes to its subtasks is here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, cast

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from raystream.actors.liveness import NoAnswer, SubtaskLiveness
from raystream.actors.messages import ChannelId
from raystream.actors.subtask_spec import SubtaskEnding, SubtaskSpec, TerminationReport
from raystream.actors.subtask_actor import SubtaskActor
from raystream.actors.subtask_checkpoints import CheckpointingSpec
from raystream.checkpoint.barrier import Barrier
from raystream.checkpoint.config import AlignmentMode
from raystream.checkpoint.coordinator_holder import CoordinatorFailure
from raystream.checkpoint.restore import RestoreSpec
from raystream.checkpoint.subtask_gateway import EventDeliveryError, GatewayProtocolError
from raystream.actors.resources import Resources
from raystream.engine.failover import Failure
from raystream.engine.job_events import SubtaskKey
from raystream.engine.job_options import JobOptions
from raystream.engine.plan import JobPlan

NAMESPACE = "raystream"
# Unaligned checkpoints are taken between two slices of a received batch: about
# Flink's network buffer (32 KiB), so a barrier never waits behind a whole message.
UNALIGNED_SLICE_BYTES = 32 * 1024
RELEASE_WAIT_S = 2.0  # for the subtasks of a failed or canceled job to end before pooling
HOST_TIMEOUT_S = 20.0  # a live actor hosts its next subtask within this (it stops the old one first)
# Subtasks spread over the cluster's nodes (within what each operator asks for), so one
# lost node costs a part of every operator, and a job uses every node's CPUs and memory.
SUBTASK_SCHEDULING = "SPREAD"
NODE_PING_TIMEOUT_S = 2.0  # how long the subtasks of a node that may be lost get to answer
METRICS_TIMEOUT_S = 10.0
# the Ray actor class (its decorator's options are beyond Ray's type stubs, so a type
# checker sees the plain class, without .options)
_SUBTASK_ACTOR = cast(Any, SubtaskActor)


# checkpoints an attempt completes before a new warm spare starts: by then a recovery has
# caught up with its input (bench/checkpoint_overhead.py: about a second after the restore)
SPARE_AFTER_CHECKPOINTS = 2


class RegionRefused(Exception):
    """A region failover cannot go on (a survivor refused the restarted region)."""


class SubtaskFailure(Exception):
    """A subtask failed (raised inside the event thread to start a failover)."""

    def __init__(self, report: TerminationReport) -> None:
        super().__init__(report.error)
        self.report = report


def deployment_failure(exc: RayActorError) -> SubtaskFailure:
    """A subtask's process died while its attempt was being deployed."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return SubtaskFailure(TerminationReport(
        -1, -1, SubtaskEnding.FAILED, operator="deployment",
        error=f"a subtask died during deployment: {type(exc).__name__}: {first_line}"))


def failure_of(exc: Exception) -> Failure:
    """What the failover is told of an exception met by the event thread."""
    if isinstance(exc, SubtaskFailure):
        report = exc.report
        return Failure(report.error, report.operator, report.index if report.index >= 0 else None,
                       report.traceback, report.error_types,
                       vertex=report.vertex_id if report.index >= 0 else None)
    if isinstance(exc, (CoordinatorFailure, EventDeliveryError, GatewayProtocolError)):
        return Failure(str(exc), getattr(exc, "operator", "coordinator"))
    return Failure(f"checkpoint coordinator: {exc}", "coordinator")


class _RayDelivery:
    """The delivery of an operator event: a Ray call to the subtask's control lane."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self._error: BaseException | None = None
        self._done = False

    def done(self) -> bool:
        if not self._done:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                self._done = True
                try:
                    ray.get(self.ref)
                except Exception as exc:
                    self._error = exc
        return self._done

    def error(self) -> BaseException | None:
        return self._error


@dataclass(frozen=True)
class Deployed:
    """When a deployment stopped the previous attempt and started the new one (wall clock)."""

    cancelled_at: float
    started_at: float


class Deployment:
    """The subtask actors of one job, for its current attempt."""

    def __init__(self, job_id: str, job_name: str, plan: JobPlan, options: JobOptions) -> None:
        self.job_id, self.job_name, self.plan, self.options = job_id, job_name, plan, options
        self.actors: dict[SubtaskKey, Any] = {}
        self.attempts: dict[SubtaskKey, int] = {}  # the attempt each subtask runs
        self.placement: dict[str, str] = {}  # "chain/index" -> id of the node it runs on
        self.died_on: set[str] = set()  # nodes where subtasks of this attempt died
        self.terminations: dict[Any, SubtaskKey] = {}  # await_termination call -> subtask
        self.spare: Any = None  # a warm, empty subtask actor for failover
        self.pooled: list[Any] = []  # the driver's actors, until the first deployment
        self._pooled_ids: set[Any] = set()
        self._keeper: Any = None  # the driver's pool keeper, which leased them
        self._spare_avoids: dict[str, Any] = {}  # where the spare may not run (lost nodes)
        self._completed: dict[int, int] = {}  # attempt -> checkpoints it completed

    def lease_pooled(self) -> None:
        """Take the driver's pooled actors leased to this job from its keeper (none if
        it has none, or is gone: with its driver, and the actors with it)."""
        if self.options.pool_keeper is None:
            return
        try:
            self._keeper = ray.get_actor(self.options.pool_keeper, namespace=NAMESPACE)
            self.pooled = list(ray.get(self._keeper.leased.remote(self.job_id)))
        except (ValueError, RayActorError):
            self._keeper, self.pooled = None, []
        self._pooled_ids = {actor._actor_id for actor in self.pooled}

    def metrics_name(self, key: SubtaskKey) -> str:
        """``chain/index``: how placement and metrics name a subtask."""
        return f"{self.plan.vertices[key[0]].name}/{key[1]}"

    # -- calls to every subtask -------------------------------------------------------------
    def trigger_checkpoint(self, barrier: Barrier) -> None:
        for key, actor in self.actors.items():  # each with its own attempt (regions)
            attempt = self.attempts[key]
            actor.trigger_checkpoint.remote(barrier if barrier.attempt == attempt
                                            else dataclasses.replace(barrier, attempt=attempt))

    def notify_checkpoint_complete(self, n: int, attempt: int) -> None:
        for key, actor in self.actors.items():
            actor.notify_checkpoint_complete.remote(n, self.attempts[key])
        self._completed[attempt] = self._completed.get(attempt, 0) + 1
        if self._completed[attempt] >= SPARE_AFTER_CHECKPOINTS:
            self._keep_spare(attempt)

    def notify_checkpoint_aborted(self, n: int) -> None:
        for key, actor in self.actors.items():
            actor.notify_checkpoint_aborted.remote(n, self.attempts[key])

    def cancel(self) -> None:
        for actor in self.actors.values():
            actor.cancel.remote()

    def drain_sources(self) -> None:
        """The sources end their input (the final checkpoint is a savepoint)."""
        for (vertex, _), actor in self.actors.items():
            if self.plan.vertices[vertex].is_source:
                actor.drain.remote()

    def metrics(self) -> dict[str, dict[str, float]]:
        """Live metrics of every subtask, by "chain/index" ({} if they do not answer)."""
        actors = self.actors  # the event thread may replace it (failover)
        refs = {key: actor.metrics.remote() for key, actor in actors.items()}
        try:
            values = ray.get(list(refs.values()), timeout=METRICS_TIMEOUT_S)
            return {self.metrics_name(k): v for k, v in zip(refs, values)}
        except Exception:
            return {}

    def liveness(self, keys: list[SubtaskKey]) -> dict[SubtaskKey, SubtaskLiveness | NoAnswer]:
        """What the subtasks ``keys`` still wait for; for one that does not answer within
        :data:`NODE_PING_TIMEOUT_S`, why not."""
        actors = self.actors  # the event thread may replace it (failover)
        refs = {key: actors[key].liveness.remote() for key in keys if key in actors}
        answers: dict[SubtaskKey, SubtaskLiveness | NoAnswer] = {
            key: NoAnswer(self.subtask_name(key), "not deployed in this attempt")
            for key in keys if key not in actors}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                            timeout=NODE_PING_TIMEOUT_S)
        done = set(ready)
        for key, ref in refs.items():
            if ref not in done:
                answers[key] = NoAnswer(self.subtask_name(key),
                                        f"no answer in {NODE_PING_TIMEOUT_S:.0f} s")
                continue
            try:
                answers[key] = ray.get(ref)
            except Exception as exc:
                answers[key] = NoAnswer(self.subtask_name(key),
                                        f"{type(exc).__name__}: {exc}".splitlines()[0])
        return answers

    def subtask_name(self, key: SubtaskKey) -> str:
        """``chain[index]``, as diagnoses and test output name a subtask."""
        return f"{self.plan.vertices[key[0]].name}[{key[1]}]"

    def subtask_actors(self) -> dict[str, list[Any]]:
        """The actors hosting the current attempt's subtasks, by chain."""
        actors = dict(self.actors)
        return {v.name: [actors.get((v.id, i)) for i in range(v.parallelism)]
                for v in self.plan.vertices}

    # -- terminations -------------------------------------------------------------------------
    def poll_termination(self) -> TerminationReport | None:
        """How a subtask ended, if one has since the last poll."""
        ready, _ = ray.wait(list(self.terminations), num_returns=1, timeout=0)
        return self._termination_report(ready[0]) if ready else None

    def stop(self, timeout_s: float) -> TerminationReport | None:
        """Stop every subtask; the failure of one that failed on the way or had not stopped
        within ``timeout_s`` (None: all stopped)."""
        for actor in self.actors.values():
            actor.stop.remote()
        pending = list(self.terminations)
        done, not_done = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in done:
            report = self._termination_report(ref)
            if report.status == SubtaskEnding.FAILED:
                return report
        return self._not_stopped(not_done, timeout_s) if not_done else None

    def _not_stopped(self, refs: list[Any], timeout_s: float) -> TerminationReport:
        """The failure of subtasks that did not confirm their stop (and so their final
        commit) in time."""
        keys = [self.terminations[ref] for ref in refs]
        names = [f"subtask {index + 1}/{self.plan.vertices[vertex].parallelism} of "
                 f"'{self.plan.vertices[vertex].name}'" for vertex, index in keys]
        vertex, index = keys[0]
        return TerminationReport(
            vertex, index, SubtaskEnding.FAILED, operator=self.plan.vertices[vertex].name,
            error=f"{', '.join(names)} did not stop within {timeout_s:g} s after the "
                  f"final checkpoint: its final commit is not confirmed")

    def _termination_report(self, ref: Any) -> TerminationReport:
        key = self.terminations.pop(ref)
        try:
            return ray.get(ref)
        except RayActorError as exc:
            vertex = self.plan.vertices[key[0]]
            node = self.placement.get(f"{vertex.name}/{key[1]}")
            if node is not None:
                self.died_on.add(node)
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            return TerminationReport(
                key[0], key[1], SubtaskEnding.FAILED, operator=vertex.name,
                error=f"subtask {key[1] + 1}/{vertex.parallelism} of '{vertex.name}' died: "
                      f"{type(exc).__name__}: {first_line}")

    def lost_nodes(self) -> list[str]:
        """Nodes that seem to have died with subtasks of this job, to keep the restart off.

        Ray declares a node dead only once its health checks fail (15 s by default); until
        then it would place new subtasks there and the restart would fail again. A node is
        taken for lost when a subtask on it died, it is not this master's node, and none of
        the job's other subtasks there answers within ``NODE_PING_TIMEOUT_S``.
        """
        suspects, self.died_on = self.died_on - {ray.get_runtime_context().get_node_id()}, set()
        if not suspects:
            return []
        on_node = {node: [actor for key, actor in self.actors.items()
                          if self.placement.get(self.metrics_name(key)) == node]
                   for node in suspects}
        pings = {node: [actor.ready.remote() for actor in actors] for node, actors in on_node.items()}
        refs = [ref for node_refs in pings.values() for ref in node_refs]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=NODE_PING_TIMEOUT_S)
        answered = set()
        for ref in done:
            try:
                ray.get(ref)
                answered.add(ref)
            except Exception:  # a dead subtask answers with an error
                pass
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        return sorted(node for node, node_refs in pings.items()
                      if node in alive and not answered.intersection(node_refs))

    # -- deploying ------------------------------------------------------------------------------
    def deploy(self, attempt: int, restore: RestoreSpec | None,
               avoid_nodes: list[str] | tuple[str, ...] = ()) -> Deployed:
        """Deploy ``attempt``, none of it on ``avoid_nodes`` (ids of lost nodes).

        Actors of the previous attempt that are still alive host their new subtask
        (no new process to start); a dead one is replaced by the warm spare where
        its resources allow, else by a new actor. ``RayActorError``: a subtask died
        meanwhile (the job fails over)."""
        previous, self.actors, self.terminations = self.actors, {}, {}
        self.died_on = set()
        specs = self._specs(attempt, restore, {(v.id, i) for v in self.plan.vertices
                                               for i in range(v.parallelism)})
        cancelled_at = self._host(specs, previous, avoid_nodes, pooled=True)
        self.placement = dict(zip(map(self.metrics_name, self.actors), self._ready(self.actors)))
        self._connect(specs)
        self._start(specs)
        deployed = Deployed(cancelled_at=cancelled_at, started_at=time.time())
        lost = bool(avoid_nodes)
        if self.spare is None and self.pooled and not lost:
            self.spare = self.pooled.pop()  # a leased actor left over: the warm spare
        self._spare_avoids = self._avoid(avoid_nodes)
        return deployed

    def deploy_region(self, attempt: int, region: frozenset[SubtaskKey], restore: RestoreSpec,
                      avoid_nodes: list[str] | tuple[str, ...] = ()) -> Deployed:
        """Redeploy the subtasks of ``region`` alone as ``attempt``, restored from
        ``restore``, while every other subtask runs on (a region failover). The
        committers the region sends to are told first (they drop what the region's
        failed attempt handed over after ``restore``'s checkpoint).

        :class:`RegionRefused`: a committer could not go on with the new attempt
        (its input had ended): the job must restart as a whole. ``RayActorError``: a
        subtask died meanwhile."""
        previous = {key: self.actors.pop(key) for key in region if key in self.actors}
        self.terminations = {ref: key for ref, key in self.terminations.items()
                             if key not in region}
        self.died_on = set()
        specs = self._specs(attempt, restore, region)
        cancelled_at = self._host(specs, previous, avoid_nodes, pooled=False)
        self.placement.update(zip((self.metrics_name(k) for k in specs),
                                  self._ready({k: self.actors[k] for k in specs})))
        self._connect(specs)
        self._tell_survivors(specs, attempt, restore.checkpoint_id)
        self._start(specs)
        return Deployed(cancelled_at=cancelled_at, started_at=time.time())

    def _specs(self, attempt: int, restore: RestoreSpec | None,
               keys: set[SubtaskKey] | frozenset[SubtaskKey]) -> dict[SubtaskKey, SubtaskSpec]:
        plan, options = self.plan, self.options
        me = ray.get_runtime_context().current_actor
        checkpointing = None
        if options.checkpoints is not None:
            unaligned = options.checkpoints.alignment is not AlignmentMode.ALIGNED
            checkpointing = CheckpointingSpec(options.checkpoints.storage, self.job_id,
                                              UNALIGNED_SLICE_BYTES if unaligned else None,
                                              state_backend=options.checkpoints.state_backend)
        return {(vertex.id, index): SubtaskSpec(
                    self.job_id, self.job_name, attempt, vertex, index, plan.max_parallelism,
                    options.credits, master=me, checkpointing=checkpointing, restore=restore,
                    failpoints=options.failpoints, in_flight_s=options.in_flight_s)
                for vertex in plan.vertices for index in range(vertex.parallelism)
                if (vertex.id, index) in keys}

    @staticmethod
    def _avoid(avoid_nodes: list[str] | tuple[str, ...]) -> dict[str, Any]:
        return {"label_selector": {"ray.io/node-id": f"!in({','.join(avoid_nodes)})"}
                } if avoid_nodes else {}

    def _host(self, specs: dict[SubtaskKey, SubtaskSpec], previous: dict[SubtaskKey, Any],
              avoid_nodes: list[str] | tuple[str, ...], *, pooled: bool) -> float:
        """Host ``specs`` on ``previous``'s live actors, the driver's pooled ones (if
        ``pooled``), the spare, or new actors; when no subtask of ``previous`` ran any
        more (wall clock)."""
        plan = self.plan
        avoid = self._avoid(avoid_nodes)
        lost = set(avoid_nodes)
        on_lost = {key for key in previous if self.placement.get(self.metrics_name(key)) in lost}
        for key in on_lost:  # calls to them could hang until Ray declares the node dead
            ray.kill(previous[key])
        hosted = {key: previous[key].host.remote(spec)
                  for key, spec in specs.items() if key in previous and key not in on_lost}
        for key, ref in hosted.items():
            try:
                ray.get(ref, timeout=HOST_TIMEOUT_S)
                self.actors[key] = previous[key]
            except (RayActorError, RuntimeError, GetTimeoutError, RayTaskError):
                ray.kill(previous[key])  # dead, or its subtask would not stop
        cancelled_at = time.time()  # no subtask of the previous attempt runs any more
        if pooled:
            self._host_on_pooled(specs)
        for key, spec in specs.items():
            self.attempts[key] = spec.attempt
            if key in self.actors:
                continue
            vertex = plan.vertices[key[0]]
            if self.spare is not None and lost:  # it may be on a lost node: do not wait on it
                ray.kill(self.spare)
                self.spare = None
            if self.spare is None and not lost and spec.attempt > 0:
                self._spare_from_pool()  # no spare yet: an idle actor is one
            if self.spare is not None and vertex.resources == Resources():
                spare, self.spare = self.spare, None
                if not lost:  # its successor now, before this subtask runs: a failure
                    self._spare_from_pool()  # during this recovery finds a spare too
                try:
                    ray.get(spare.host.remote(spec), timeout=HOST_TIMEOUT_S)
                    self.actors[key] = spare
                    continue
                except (RayActorError, GetTimeoutError):
                    ray.kill(spare)
            self.actors[key] = _SUBTASK_ACTOR.options(
                name=spec.actor_name, namespace=NAMESPACE,
                scheduling_strategy=SUBTASK_SCHEDULING, **avoid,
                **vertex.resources.ray_options()).remote(spec)
        return cancelled_at

    def _ready(self, actors: dict[SubtaskKey, Any]) -> list[str]:
        """The nodes ``actors`` run on, once each has started."""
        try:
            return ray.get([a.ready.remote() for a in actors.values()],
                           timeout=self.options.actor_start_timeout_s)
        except GetTimeoutError:
            raise RuntimeError(
                f"{len(actors)} subtask actors did not start within "
                f"{self.options.actor_start_timeout_s:.0f} s; the cluster has "
                f"{ray.available_resources()} available") from None

    def _connect(self, specs: dict[SubtaskKey, SubtaskSpec]) -> None:
        """Wire ``specs``' subtasks to their neighbours' actors."""
        calls = []
        for (vertex_id, index) in specs:
            vertex = self.plan.vertices[vertex_id]
            downstream = {c: self.actors[(e.target_vertex, c.downstream)]
                          for e in vertex.outputs for c in e.output_channels(index)}
            upstream = {c: self.actors[(e.source_vertex, c.upstream)]
                        for e in vertex.inputs for c in e.input_channels(index)}
            calls.append(self.actors[(vertex_id, index)].connect.remote(downstream, upstream))
        ray.get(calls)

    def _tell_survivors(self, specs: dict[SubtaskKey, SubtaskSpec], attempt: int,
                        checkpoint_id: int) -> None:
        """The subtasks outside ``specs`` that receive from them take the new attempt."""
        upstreams: dict[SubtaskKey, dict[ChannelId, Any]] = {}
        for (vertex_id, index) in specs:
            for edge in self.plan.vertices[vertex_id].outputs:
                for c in edge.output_channels(index):
                    target = (edge.target_vertex, c.downstream)
                    if target not in specs:
                        upstreams.setdefault(target, {})[c] = self.actors[(vertex_id, index)]
        answers = {key: self.actors[key].upstream_restarted.remote(
                       channels, attempt, checkpoint_id, HOST_TIMEOUT_S)
                   for key, channels in upstreams.items()}
        for key, ref in answers.items():
            try:
                accepted = ray.get(ref, timeout=2 * HOST_TIMEOUT_S)
            except GetTimeoutError:
                accepted = False
            if not accepted:
                raise RegionRefused(f"{self.subtask_name(key)} cannot go on with a restarted "
                                    f"upstream")

    def _start(self, specs: dict[SubtaskKey, SubtaskSpec]) -> None:
        actors = {key: self.actors[key] for key in specs}
        self.terminations.update({a.await_termination.remote(): key for key, a in actors.items()})
        for actor in actors.values():
            actor.start.remote()  # a subtask that dies from here on is seen by its termination

    def _spare_from_pool(self) -> None:
        """The spare a failover takes, replaced at once by an idle actor of the driver's
        pool (already started: no process start during the recovery), if it has one."""
        if self._keeper is None:
            return
        try:
            got = ray.get(self._keeper.lease_idle.remote(self.job_id), timeout=HOST_TIMEOUT_S)
        except (RayActorError, GetTimeoutError):
            return
        for actor in got:
            self._pooled_ids.add(actor._actor_id)
            self.spare = actor

    def _keep_spare(self, attempt: int) -> None:
        """Start a warm, empty actor (process started, modules imported) to replace a
        subtask that dies, if the job has none and may fail over. Never waited for.

        Called once ``attempt`` has completed :data:`SPARE_AFTER_CHECKPOINTS`
        checkpoints, not while it deploys: a worker process's start takes a core for
        a second or more, and on a small machine it took it from the subtasks
        restoring state (their restore took 4-6x its CPU time in wall time), then,
        at the first checkpoint, from their catching up with the input."""
        options = self.options
        if (self.spare is not None or options.checkpoints is None
                or not options.restart.attempts):
            return
        self.spare = _SUBTASK_ACTOR.options(
            name=f"raystream/{self.job_id}/spare@{attempt}", namespace=NAMESPACE,
            scheduling_strategy=SUBTASK_SCHEDULING, **self._spare_avoids,
            **Resources().ray_options()).remote(None)

    def event_transport(self) -> Callable[[str, int], Callable[[Any], Any]]:
        """Operator events go to a subtask's control lane, for the attempt it runs now;
        delivered once the call returned (the event is in the subtask's mailbox)."""
        vertex_of = {node.name: vertex.id for vertex in self.plan.vertices for node in vertex.nodes}
        actors, attempts = dict(self.actors), dict(self.attempts)

        def transport(operator: str, index: int) -> Callable[[Any], Any]:
            key = (vertex_of[operator], index)
            actor, attempt = actors[key], attempts[key]
            return lambda event: _RayDelivery(
                actor.handle_operator_event.remote(attempt, operator, event))
        return transport

    def _host_on_pooled(self, specs: dict[SubtaskKey, SubtaskSpec]) -> None:
        """Host the subtasks with default resources on the driver's leased actors (first
        attempt only). An actor that died while idle is dropped (not a failure of this
        job); one that dies while hosting is a deployment failure like any other."""
        leased, self.pooled = self.pooled, []
        if not leased:
            return
        pings = {actor.ready.remote(): actor for actor in leased}
        ready, late = ray.wait(list(pings), num_returns=len(pings),
                               timeout=self.options.actor_start_timeout_s)
        live = []
        for ref in ready:
            try:
                ray.get(ref)
                live.append(pings[ref])
            except RayActorError:
                pass  # died while idle: its subtask goes to a new actor
        for ref in late:
            ray.kill(pings[ref])
        hosting = {}
        for key, spec in specs.items():
            if live and key not in self.actors and (
                    self.plan.vertices[key[0]].resources == Resources()):
                actor = live.pop()
                hosting[key] = (actor, actor.host.remote(spec))
        self.pooled = live  # left over: the spare, or back to the pool at the end
        died: RayActorError | None = None
        for key, (actor, ref) in hosting.items():
            try:
                ray.get(ref, timeout=self.options.actor_start_timeout_s)
                self.actors[key] = actor
            except (GetTimeoutError, RayTaskError):  # a subtask that would not
                ray.kill(actor)                                       # stop: a new actor instead
            except RayActorError as exc:  # it died deploying: a failure of this job
                died = died or exc
        if died is not None:
            raise died  # the failover hosts the next attempt on the live ones

    def drop_pooled(self) -> None:
        """The job master that leased the driver's pooled actors died, and this is its
        successor's deployment: they may still run subtasks of the dead master's attempt,
        so they are killed, never hosted on (:meth:`release` tells the pool they are gone)."""
        for actor in self.pooled:
            ray.kill(actor)
        self.pooled = []

    def release(self) -> None:
        """The job is over: the driver's pooled actors whose subtask has ended go back to
        its pool; every other actor of the job is killed."""
        actors = [*self.actors.values(), *self.pooled,
                  *([self.spare] if self.spare is not None else [])]
        # a subtask whose termination was reported has ended (one that died was replaced,
        # or failed the job: a dead actor given back is dropped at the next lease)
        ended = set(self.actors) - set(self.terminations.values())
        if self.terminations:  # a failed or canceled job: its subtasks may still be ending
            done, _ = ray.wait(list(self.terminations), num_returns=len(self.terminations),
                               timeout=RELEASE_WAIT_S)
            for ref in done:
                try:
                    ray.get(ref)
                    ended.add(self.terminations[ref])
                except Exception:  # its process died (or its node): not for the pool
                    pass
        idle_ids = {self.actors[key]._actor_id for key in ended if key in self.actors}
        idle_ids |= {a._actor_id for a in [*self.pooled, self.spare] if a is not None}
        back = {a._actor_id: a for a in actors
                if a._actor_id in self._pooled_ids and a._actor_id in idle_ids}
        for actor in back.values():  # an idle actor keeps no state of this job
            actor.forget_job.remote()
        if self._keeper is not None:  # (also when none was leased: it forgets the job)
            self._keeper.give_back.remote(
                self.job_id, list(back.values()), [i.hex() for i in self._pooled_ids if i not in back])
        for actor in actors:
            if actor._actor_id not in back:
                try:
                    ray.kill(actor)
                except Exception:
                    pass
