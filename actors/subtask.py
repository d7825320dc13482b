"""A subtask: one parallel instance of an operator chain, hosted by a Ray actor
(:mod:`raystream.actors.subtask_actor`, whose methods only enqueue or report).

All processing happens on one thread, the mailbox loop (Flink's
``MailboxProcessor``): it takes control messages first, then — unless an
output channel is out of credit (backpressure) or the checkpoint barrier has
blocked it — one input message or, in a source subtask, one batch from the
source. No actor method blocks waiting for a peer.

Checkpoints: aligned (a channel blocks at its barrier until all have it),
unaligned (the first barrier snapshots at once; in-flight data becomes
channel state, :mod:`raystream.actors.channel_state`), or aligned with a
timeout (turns unaligned when the timeout passes, here and at senders whose
barrier is still queued behind output). With unaligned checkpoints a received
batch is handed to the chain in ~32 KiB slices, so a barrier waits for one
slice rather than a whole message.

Life cycle: RUNNING until every input has ended and all output is sent; then
the subtask reports *finished* to the job master but stays alive, taking part
in checkpoints (the final one commits its last output, FLIP-147) until the
master stops it.
"""

from __future__ import annotations

import collections
import functools
import gc
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray

from raystream.actors.barrier_forwarder import BarrierForwarder
from raystream.actors.barrier_handler import (Action, Alignment, BarrierAnnounced, BarrierHandler,
                                              BlockChannel, BoundRecording, CancelChannelState,
                                              CheckpointAborted, Decline, ResumeChannels,
                                              StartRecording, TakeSnapshot, TriggerReceived,
                                              wall_clock_ms)
from raystream.actors.channel_state import InputStateRecorder, OutputStateCapture
from raystream.actors.channels import InputGate, OutputChannel
from raystream.actors.liveness import ChannelProgress, SubtaskLiveness
from raystream.actors.mailbox import (BarrierReceived, Cancel, CheckpointCompleted, Credit,
                                      Drain, Mail, OperatorEvent, Stop, UpstreamReply,
                                      UpstreamRestarted)
from raystream.actors.messages import (MAX_WATERMARK, MIN_WATERMARK, ChannelId,
                                       Envelope, Kind)
from raystream.checkpoint.barrier import Barrier
from raystream.actors.input_credits import InputCredits
from raystream.actors.stream_input import InputStep, StreamInput
from raystream.actors.record_writer import RecordWriter, batch_payload
from raystream.actors.channel_state_file import ChannelStateContents
from raystream.checkpoint.local_recovery import StateOrigin
from raystream.checkpoint.state_backend import StateBackend
from raystream.actors.subtask_checkpoints import SubtaskCheckpointer
from raystream.actors.subtask_metrics import SubtaskMetricsExporter
from raystream.core.failpoints import Failpoints
from raystream.actors.master_gateway import MasterGateway
from raystream.actors.subtask_spec import SubtaskEnding, SubtaskSpec, TerminationReport
from raystream.actors.subtask_lifecycle import Lifecycle, advance
from raystream.actors.operator import (BroadcastingOutput, ChainedOutput, Operator,
                                       OperatorFailure, RoutingOutput, RuntimeContext,
                                       SinkOperator, SourceOperator, call_operator)

IDLE_WAIT_S = 0.05


class NullOutput:
    def emit(self, batch):
        raise RuntimeError("a sink has no output")

    def emit_watermark(self, watermark):
        pass


def _fan_out(targets: list) -> Any:
    return targets[0] if len(targets) == 1 else (
        BroadcastingOutput(targets) if targets else NullOutput())


class _HandlerView:
    """The subtask as its barrier handler reads it (``barrier_handler.InputView``)."""

    __slots__ = ("subtask",)

    def __init__(self, subtask: Subtask) -> None:
        self.subtask = subtask

    @property
    def is_source(self) -> bool:
        return self.subtask.source is not None

    def inputs_ended(self) -> bool:
        return self.subtask.lifecycle.input_ended

    def mid_batch(self) -> bool:
        return self.subtask.input.in_progress is not None

    def backlogged(self) -> bool:
        return self.subtask._backlogged()

    def channels_finished(self) -> bool:
        gate = self.subtask.gate
        return len(gate) > 0 and gate.all_finished()

    def channels_ending(self) -> bool:
        return all(c.finished or c.end_of_input is not None for c in self.subtask.gate)

    def aligned_checkpoint(self) -> int | None:
        gate = self.subtask.gate
        return gate.aligned_checkpoint() if len(gate) else None


class Subtask:
    """The mailbox loop and everything it owns; hosted by :class:`SubtaskActor`.

    Barrier handling is decided by :class:`BarrierHandler` (no Ray, no I/O);
    the subtask feeds it events and carries out the actions it returns.
    """

    def __init__(self, spec: SubtaskSpec) -> None:
        self.spec = spec
        vertex = spec.vertex
        self.operators: list[Operator] = [node.create_operator() for node in vertex.nodes]
        self.gate = InputGate(vertex.input_channels(spec.index))
        self.cond = threading.Condition()
        self.mailbox: collections.deque[Mail] = collections.deque()
        self.out_channels: dict[ChannelId, OutputChannel] = {}
        self.upstreams: dict[ChannelId, Any] = {}
        # input channels whose sender a region failover restored: the attempt they carry
        # (the others carry this subtask's); changed under the lock
        self.channel_attempts: dict[ChannelId, int] = {}
        self.credits = InputCredits(self.gate.channels, credits=spec.credits,
                                    in_flight_s=spec.in_flight_s)
        self.failpoints = Failpoints(spec.failpoints, vertex.name, spec.index, spec.attempt)
        self.input = StreamInput(
            self.gate, self.credits, self.operators[0], failpoints=self.failpoints,
            slice_bytes=spec.checkpointing.slice_bytes if spec.checkpointing else None,
            fetch=ray.get)
        self.lifecycle = Lifecycle.RUNNING
        # A recovery (every attempt after the first) is timed by stage: each subtask tells
        # the master when it has restored, a sink chain when it processed its first record
        # what this subtask tells its job master (none: a subtask run without one, in tests)
        self.gateway = (MasterGateway(spec.master, spec.attempt, spec.vertex.id, spec.index)
                        if spec.master is not None else None)
        self.recovering = spec.attempt > 0 and self.gateway is not None
        # a sink's chain (a writer's too, whose committables alone go on: in a region
        # failover the committer is no subtask of the new attempt)
        self.first_record_due = self.recovering and all(e.into_committer for e in vertex.outputs)
        self.barrier_handler = BarrierHandler(_HandlerView(self))
        # unaligned checkpoints whose input in flight is still being recorded, by id
        self.input_states: dict[int, InputStateRecorder] = {}
        self._recording: InputStateRecorder | None = None  # started for the next snapshot
        # stop-with-savepoint: emit nothing after this savepoint's barrier, unless it aborts
        self.stopped_by: int | None = None
        self.checkpointer: SubtaskCheckpointer | None = None
        self.source: SourceOperator | None = None  # the head, if a source (set by connect)
        self.report: TerminationReport | None = None
        self.done = threading.Event()
        self.backpressured_s = 0.0  # waiting for credit
        self.created = time.monotonic()
        self.exporter = SubtaskMetricsExporter(spec.job_name, spec.job_id, vertex.name, spec.index)
        self._thread: threading.Thread | None = None

    # -- wiring ---------------------------------------------------------------
    def connect(self, downstream: dict[ChannelId, Any], upstream: dict[ChannelId, Any]) -> None:
        spec, vertex = self.spec, self.spec.vertex
        writers: dict[int, RecordWriter] = {}
        for edge in vertex.outputs:
            channels = []
            for channel in edge.output_channels(spec.index):
                handle = downstream[channel]
                out = OutputChannel(channel, attempt=spec.attempt, credits=self.credits.start,
                                    transmit=lambda env, h=handle: h.deliver.remote(env))
                self.out_channels[channel] = out
                channels.append(out)
            partitioner = edge.partitioning.create(spec.max_parallelism)
            partitioner.setup(spec.index, len(channels))
            sender = vertex.nodes[edge.source_node]
            writers[edge.id] = RecordWriter(partitioner, channels,
                                            buffer_timeout_ms=sender.buffer_timeout_ms)
        self.writers = list(writers.values())
        self.upstreams = dict(upstream)
        self.downstream = dict(downstream)
        self.forwarder = BarrierForwarder(self.out_channels, self._announce)
        for node, operator in zip(vertex.nodes, self.operators):
            targets = [ChainedOutput(self.operators[i]) for i in node.chained_outputs]
            targets += [writers[e] for e in node.network_outputs]
            output = _fan_out(targets)
            sides: dict[str, list] = {}
            for tag, i in node.side_chained_outputs:
                sides.setdefault(tag, []).append(ChainedOutput(self.operators[i]))
            for tag, e in node.side_network_outputs:
                sides.setdefault(tag, []).append(writers[e])
            if sides:
                output = RoutingOutput(output, {tag: _fan_out(t) for tag, t in sides.items()})
            events = None
            if node.coordinator is not None and self.gateway is not None:
                events = functools.partial(self.gateway.operator_event, node.name)
            ctx = RuntimeContext(spec.job_name, node.name, spec.index, vertex.parallelism,
                                 spec.max_parallelism, spec.attempt,
                                 checkpointing=spec.checkpointing is not None,
                                 job_id=spec.job_id, coordinator_events=events,
                                 state_backend=(spec.checkpointing.state_backend
                                                if spec.checkpointing else StateBackend.HEAP),
                                 buffer_timeout_ms=node.buffer_timeout_ms)
            operator.setup(ctx, output, self.failpoints)
        # operators with processing-time timers, polled by the mailbox loop
        self.timed_operators = [op for op in self.operators
                                if type(op).next_processing_time is not Operator.next_processing_time]
        head = self.operators[0]
        self.source = head if isinstance(head, SourceOperator) else None
        # operators with an operator coordinator, by name: they receive its events
        self.coordinated = {node.name: op for node, op in zip(vertex.nodes, self.operators)
                            if node.coordinator is not None}
        if spec.checkpointing is not None:
            self.checkpointer = SubtaskCheckpointer(
                spec=spec.checkpointing, names=[n.name for n in vertex.nodes],
                operators=self.operators, vertex_id=vertex.id, vertex_name=vertex.name,
                index=spec.index, parallelism=vertex.parallelism,
                max_parallelism=spec.max_parallelism, attempt=spec.attempt,
                failpoints=self.failpoints, gateway=self._gateway())

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"subtask {self.spec.actor_name}",
                                        daemon=True)
        self._thread.start()

    # -- lanes (called from Ray's threads) -------------------------------------
    def deliver(self, envelope: Envelope) -> None:
        with self.cond:
            if not self.accepts(envelope.channel, envelope.attempt):
                return  # left over from another attempt
            self.gate.add(envelope)
            self.cond.notify()

    def accepts(self, channel: ChannelId, attempt: int) -> bool:
        """Is ``attempt`` the one whose messages ``channel`` takes now?"""
        return attempt == self.channel_attempts.get(channel, self.spec.attempt)

    def upstream_restarted(self, upstreams: dict[ChannelId, Any], attempt: int,
                           checkpoint_id: int, timeout_s: float) -> bool:
        """A region failover restored the senders of ``upstreams`` (channel -> the actor of
        its new sender) alone: take their new attempt's messages once the mailbox has
        dropped the old one's. False: refused (input ended here, or no answer within
        ``timeout_s``): the job must restart as a whole."""
        reply = UpstreamReply()
        self.post(UpstreamRestarted(dict(upstreams), attempt, checkpoint_id, reply))
        return reply.done.wait(timeout_s) and reply.accepted

    def post(self, mail: Mail) -> None:
        with self.cond:
            self.mailbox.append(mail)
            self.cond.notify()

    # -- the mailbox loop --------------------------------------------------------
    def _backlogged(self) -> bool:
        return any(c.backlogged() for c in self.out_channels.values())

    def _runnable(self) -> bool:
        """Under the lock: is there something to do besides control messages?"""
        if self._backlogged():
            return False
        if self.lifecycle.input_ended:  # report once, then only control messages
            return self.lifecycle is Lifecycle.INPUT_ENDED
        if self.input.in_progress is not None:
            return True
        if self.source is not None:
            return self.stopped_by is None and self.source.is_available()
        return self.gate.has_ready()

    def _run(self) -> None:
        try:
            if self.checkpointer is not None:
                channel_state = self.checkpointer.restore(self.spec.restore)
                if self.checkpointer.restored_floors is not None:
                    # the lowest any key group had reached: keyed operators keep their own
                    self.input.restore_watermark(self.checkpointer.restored_floors.minimum())
                self.barrier_handler.last_taken = self.checkpointer.last_checkpoint_id
                if self.spec.restore is not None:
                    self.failpoints.hit("right_after_restore")
                if channel_state is not None:
                    self._replay_channel_state(channel_state)
            else:
                for operator in self.operators:
                    call_operator(operator, "initialize_state", None)
            for operator in self.operators:
                call_operator(operator, "open")
            if self.recovering:
                self._report_stage("restored", self.checkpointer.restored_from
                                   if self.checkpointer is not None else None)
            # What exists now (modules, operators, restored state) lives as long as the
            # subtask: out of the collector's way, a full collection scans only what the loop
            # made since (one of a map subtask's whole heap took ~100 ms on a busy 2-core
            # machine, a pause every row in flight waits out)
            gc.freeze()
            self._loop()
            self._finish(SubtaskEnding.CANCELED if self.lifecycle is Lifecycle.CANCELED
                         else SubtaskEnding.FINISHED)
        except OperatorFailure as failure:
            self._fail(failure.operator, failure.cause, failure.traceback)
        except BaseException as exc:  # the runtime itself failed: still report, never hang
            import traceback
            self._fail(self.spec.vertex.name, exc, traceback.format_exc())
        finally:
            for operator in self.operators:
                try:
                    operator.close()
                except Exception:
                    pass
            if self.checkpointer is not None:
                self.checkpointer.close()
            for operator in self.operators:
                try:
                    operator.end_attempt()
                except Exception:
                    pass
            gc.unfreeze()  # an actor hosting the next attempt collects this one's leftovers
            self.done.set()

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            self.exporter.maybe_export(now, self.metrics)
            for writer in self.writers:
                writer.flush_if_due(now)
            self._send_credits(idle=False)
            with self.cond:
                if not self.mailbox and not self._runnable():
                    idle = True
                else:
                    idle = False
            if idle:
                self._flush_ready_outputs()  # nothing else to do: do not sit on output
                self._send_credits(idle=True)
                waited_from = time.perf_counter()
                deadline_ms = self._next_deadline_ms()
                with self.cond:
                    while not self.mailbox and not self._runnable():
                        wait_s = IDLE_WAIT_S
                        if deadline_ms is not None:
                            wait_s = min(wait_s, deadline_ms / 1000 - time.time())
                            if wait_s <= 0:
                                break  # an aligned checkpoint times out: act on it
                        self.cond.wait(wait_s)
                        if self.exporter.due(time.monotonic()):
                            break  # an idle subtask's metrics (watermark lag) still go out
                if self._backlogged():
                    self.backpressured_s += time.perf_counter() - waited_from
            with self.cond:
                mails = list(self.mailbox)
                self.mailbox.clear()
            for mail in mails:
                self._handle(mail)
            if self.lifecycle.ends_loop:
                return
            if any(type(mail) is Credit for mail in mails):  # rows due may go now, not
                now = time.monotonic()  # after the source's next poll
                for writer in self.writers:
                    writer.flush_if_due(now)
            if mails:
                self._progress()  # an unaligned barrier goes before any more input
            with self.cond:
                take_input = not self._backlogged() and not self.lifecycle.input_ended
                envelope = None
                if take_input and self.source is None and self.input.in_progress is None:
                    envelope = self.gate.poll()
            if take_input:
                self._fire_processing_timers()
            if take_input and self.input.in_progress is not None:
                self.input.process_slice()
            elif envelope is not None:
                self._process(envelope)
            elif (take_input and self.source is not None and self.stopped_by is None
                  and call_operator(self.source, "is_available")):
                if not call_operator(self.source, "emit_next"):
                    self._end_of_input()
                elif self.source.caught_up():  # its next poll may wait: do not sit on output
                    self._flush_ready_outputs()
                if self.first_record_due and not self.lifecycle.input_ended:  # chained to a sink
                    self._report_first_record()
            self._progress()
            if self.forwarder.pending:
                self.forwarder.settle(wall_clock_ms)
            if self.lifecycle is Lifecycle.INPUT_ENDED and not self._backlogged():
                self._report_finished()

    def _handle(self, mail: Mail) -> None:
        match mail:
            case Credit(channel, n):
                out = self.out_channels.get(channel)
                if out is not None:
                    out.add_credit(n)
            case TriggerReceived():
                self._carry_out(self.barrier_handler.handle(mail))
            case OperatorEvent(name, event):  # before any later barrier
                call_operator(self.coordinated[name], "handle_operator_event", event)
            case BarrierReceived():
                self._on_barrier(mail)
            case CheckpointCompleted(n):
                self._checkpointing().notify_complete(n)
            case CheckpointAborted(n):
                self._carry_out(self.barrier_handler.handle(mail))
                self._checkpointing().notify_aborted(n)
                if n == self.stopped_by:  # a failed stop resumes the sources (Flink)
                    self.stopped_by = None
            case UpstreamRestarted(upstreams, attempt, n, reply):
                reply.answer(self._reopen_inputs(upstreams, attempt, n))
            case Stop():
                if not self.lifecycle.ends_loop:
                    self._advance(Lifecycle.STOPPED)
            case Drain():  # stop-with-savepoint, draining: end the input now
                # (not once stopped or canceled: the loop ends with this mail)
                if (self.source is not None and not self.lifecycle.input_ended
                        and not self.lifecycle.ends_loop):
                    call_operator(self.source, "end_input_early")
                    self._end_of_input()
            case Cancel():
                if self.lifecycle is not Lifecycle.CANCELED:
                    self._advance(Lifecycle.CANCELED)
            case _:
                raise TypeError(f"unknown mail {mail!r}")

    def _reopen_inputs(self, upstreams: dict[ChannelId, Any], attempt: int, n: int) -> bool:
        """Region failover upstream (:meth:`upstream_restarted`): in mailbox order, so no
        message of the senders' failed attempt is processed after this."""
        if self.lifecycle.input_ended or self.lifecycle.ends_loop:
            return False  # end of input is not taken back: the job restarts as a whole
        with self.cond:
            for channel in upstreams:
                self.channel_attempts[channel] = attempt
                self.gate.reopen(channel)
        for channel, actor in upstreams.items():
            self.input.reopen(channel)
            self.upstreams[channel] = actor
        for upstream in sorted({channel.upstream for channel in upstreams}):
            call_operator(self.operators[0], "upstream_restarted", upstream, attempt, n)
        return True

    # -- checkpoints: the barrier handler decides, the subtask carries it out -----------------
    def _on_barrier(self, mail: BarrierReceived) -> None:
        """A barrier announcement (again when its sender turned it unaligned)."""
        # One lock for all of it: the gate and its recorders are shared with the data
        # lane, and a recorder completed by this announcement must already be bounded
        # by it when the snapshot thread reads it. So the bound first, then the count:
        # noting the announcement can complete a recorder (the messages its sender sent
        # after it may have arrived already), which then takes no bound any more. A
        # re-announced barrier (turned unaligned at its sender) moves the bound back,
        # and the messages past it are the sender's output channel state.
        with self.cond:
            self._carry_out(self.barrier_handler.handle(
                BarrierAnnounced(mail.channel, mail.barrier, mail.upto)))
            self.gate.note_announcement(mail.channel, mail.index)

    def _progress(self) -> None:
        """Once per loop round: take a checkpoint if one is due."""
        if self.checkpointer is not None:
            actions = self.barrier_handler.on_progress()
            if actions:
                self._carry_out(actions)

    def _carry_out(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if type(action) is TakeSnapshot:
                self._checkpoint(action)
            elif type(action) is BlockChannel:
                with self.cond:
                    self.gate.add_barrier(action.channel, action.checkpoint_id, action.upto)
            elif type(action) is ResumeChannels:
                with self.cond:
                    self.gate.release_barrier(action.checkpoint_id)
            elif type(action) is StartRecording:
                self._start_recording(action.checkpoint_id)
            elif type(action) is BoundRecording:
                recorder = self.input_states.get(action.checkpoint_id)
                if recorder is not None and not recorder.done.is_set():
                    with self.cond:
                        recorder.on_barrier(action.channel, action.upto)
            elif type(action) is Decline:
                self._gateway().decline_checkpoint(action.checkpoint_id, action.reason)
            elif type(action) is CancelChannelState:
                self._cancel_channel_state(action.checkpoint_id)
            else:
                raise TypeError(f"unknown barrier action {action!r}")

    def _start_recording(self, n: int) -> None:
        """Unaligned checkpoint ``n``: what is in flight on the inputs becomes channel state."""
        for older in [m for m in self.input_states if m < n]:
            self.input_states.pop(older).cancel()  # one unaligned checkpoint at a time
        partial = {}
        in_progress = self.input.in_progress
        if in_progress is not None:  # the rest of the batch is input in flight
            partial[in_progress.envelope.channel] = in_progress.remainder()
        with self.cond:
            recorder = InputStateRecorder(n, self.gate, partial)
            if not recorder.done.is_set():
                self.gate.recorders.append(recorder)
                self.input_states[n] = recorder
        self._recording = recorder

    def _cancel_channel_state(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: stop recording and awaiting its
        channel state (and that of older ones)."""
        for n in [n for n in self.input_states if n <= checkpoint_id]:
            self.input_states.pop(n).cancel()
        self.forwarder.cancel(checkpoint_id)
        self._checkpointing().cancel_channel_state(checkpoint_id)

    def _gateway(self) -> MasterGateway:
        """The job master's gateway, for what only a subtask of a job master does."""
        if self.gateway is None:
            raise RuntimeError(f"subtask {self.spec.actor_name} has no job master to report to")
        return self.gateway

    def _checkpointing(self) -> SubtaskCheckpointer:
        """The checkpointer, for what only a job with checkpointing asks of a subtask."""
        if self.checkpointer is None:
            raise RuntimeError(f"subtask {self.spec.actor_name} got checkpoint work, but its job "
                               f"has no checkpointing")
        return self.checkpointer

    def _checkpoint(self, snapshot: TakeSnapshot) -> None:
        barrier = snapshot.barrier
        unaligned = snapshot.alignment is Alignment.UNALIGNED
        input_state, self._recording = (self._recording if unaligned else None), None
        checkpointer, started = self._checkpointing(), time.perf_counter()
        checkpointer.prepare(barrier)
        output_state = self._forward_barrier(barrier, unaligned) if snapshot.forward else None
        checkpointer.snapshot(barrier, started=started, watermark=self.input.watermark,
                              output_state=output_state, input_state=input_state,
                              alignment_s=snapshot.alignment_s)
        if self.coordinated:  # the synchronous snapshot is taken: reopen their gateways
            self._gateway().acknowledge_coordinator_checkpoint(list(self.coordinated),
                                                               barrier.checkpoint_id)
        if barrier.kind.stops:
            self.stopped_by = barrier.checkpoint_id

    def _flush_outputs(self) -> None:
        """Send every output channel's buffered rows now."""
        for writer in self.writers:
            writer.flush()

    def _flush_ready_outputs(self) -> None:
        """Send the buffered rows of every output channel that can transmit them at once."""
        for writer in self.writers:
            writer.flush_ready()

    def _forward_barrier(self, barrier: Barrier, unaligned: bool) -> OutputStateCapture:
        """Announce ``barrier`` on every output channel; return the output channel state."""
        self._flush_outputs()  # rows emitted before the barrier go before it
        return self.forwarder.forward(
            barrier, unaligned or self.barrier_handler.unaligned_now(barrier))

    def _announce(self, out: OutputChannel, barrier: Barrier, upto: int) -> None:
        index = out.announce()
        self.downstream[out.channel].receive_barrier.remote(out.channel, barrier, upto, index)

    def _next_deadline_ms(self) -> float | None:
        """Wall-clock ms of the earliest aligned-checkpoint timeout still to act on."""
        deadlines = [d for d in (self.barrier_handler.next_deadline_ms(),
                                 self.forwarder.next_deadline_ms()) if d is not None]
        return min(deadlines) if deadlines else None

    def _replay_channel_state(self, state: ChannelStateContents) -> None:
        """Restored channel state: the input part is consumed before anything that
        arrives on its channel; the output part is sent before any new output."""
        with self.cond:
            for channel, envelopes in state.inputs.items():
                if channel not in self.gate.channels:
                    raise RuntimeError(f"restored channel state of input {channel}, which this "
                                       f"job does not have (was the job graph changed?)")
                self.gate.restore_channel_state(channel, envelopes)
        for channel, envelopes in state.outputs.items():
            out = self.out_channels.get(channel)
            if out is None:
                raise RuntimeError(f"restored channel state of output {channel}, which this "
                                   f"job does not have (was the job graph changed?)")
            for envelope in envelopes:
                payload = envelope.payload
                if envelope.kind == Kind.DATA:
                    payload = [batch_payload(payload[0])]
                out.send(envelope.kind, payload, envelope.rows)

    def _process(self, envelope: Envelope) -> None:
        step = self.input.process(envelope)
        if step is InputStep.DATA and self.first_record_due:
            self._report_first_record()
        elif step is InputStep.ENDED:
            self._end_of_input()

    def _fire_processing_timers(self) -> None:
        """Fire due processing-time timers (the idle wait bounds their lateness to
        ``IDLE_WAIT_S``)."""
        if not self.timed_operators:
            return
        now = None
        for operator in self.timed_operators:
            due = operator.next_processing_time()
            if due is not None:
                now = now or int(time.time() * 1000)
                if due <= now:
                    call_operator(operator, "on_processing_time", now)

    def _end_of_input(self) -> None:
        """Every input ended: finish the chain head to tail, then end every output."""
        for i, operator in enumerate(self.operators):
            if i > 0:
                call_operator(operator, "end_input", 0)
            call_operator(operator, "finish")
        for writer in self.writers:
            writer.end_input()
        self._advance(Lifecycle.INPUT_ENDED)

    def _send_credits(self, idle: bool) -> None:
        """Return the credits :class:`InputCredits` says are due (one Ray call each)."""
        for channel, n in self.credits.returns(idle=idle, now=time.monotonic()):
            self.upstreams[channel].add_credit.remote(
                channel, n, self.channel_attempts.get(channel, self.spec.attempt))

    def _report_first_record(self) -> None:
        self.first_record_due = False
        self._report_stage("first_record")

    def _report_stage(self, stage: str, origin: StateOrigin | None = None) -> None:
        """Tell the master this subtask reached ``stage`` of its attempt's recovery
        (engine/recovery.py's RecoveryStage; the master times a failover by them), and at
        "restored" where its state came from."""
        self._gateway().report_stage(stage, origin)

    def _advance(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = advance(self.lifecycle, lifecycle)

    def _report_finished(self) -> None:
        self._advance(Lifecycle.FINISHED)
        results = {node.transformation_id: op.final_result()
                   for node, op in zip(self.spec.vertex.nodes, self.operators)
                   if isinstance(op, SinkOperator)}
        if self.gateway is not None:
            self.gateway.report_finished(results)

    # -- endings ------------------------------------------------------------------
    def _finish(self, status: SubtaskEnding) -> None:
        self.report = TerminationReport(self.spec.vertex.id, self.spec.index, status,
                                        metrics=self.metrics())
        self.exporter.export(self.report.metrics)

    def _fail(self, operator: str, cause: BaseException, traceback_text: str) -> None:
        vertex = self.spec.vertex
        notes = "".join(f"\n  {note}" for note in getattr(cause, "__notes__", []))
        message = (f"operator '{operator}' (subtask {self.spec.index + 1}/{vertex.parallelism}) "
                   f"failed: {type(cause).__name__}: {cause}{notes}")
        self.report = TerminationReport(vertex.id, self.spec.index, SubtaskEnding.FAILED,
                                        error=message,
                                        operator=operator, traceback=traceback_text,
                                        metrics=self.metrics(),
                                        error_types=TerminationReport.error_types_of(cause))
        self.exporter.export(self.report.metrics)

    def liveness(self) -> SubtaskLiveness:
        """Where this subtask stands on its way to the end of its input (read from the
        control lane while the mailbox loop runs: plain reads of its fields)."""
        waiting = tuple(note for op in self.operators if (note := op.waiting_for()) is not None)
        channels = tuple(ChannelProgress(str(c.channel), c.end_of_input is not None,
                                         self.input.valve.of(c.channel))
                         for c in list(self.gate.channels.values()) if not c.finished)
        return SubtaskLiveness(self.spec.vertex.name, self.spec.index, self.spec.attempt,
                               self.lifecycle.input_ended,
                               self.lifecycle is Lifecycle.FINISHED, waiting, channels,
                               source=self.source is not None)

    def metrics(self) -> dict[str, float]:
        """Its figures now (read from the control lane while the mailbox loop runs)."""
        metrics: dict[str, float] = {"records_in": self.input.records_in,
                                     "batches_in": self.input.batches_in,
                                     "bytes_in": self.input.bytes_in,
                                     "backpressured_s": self.backpressured_s}
        metrics["records_out"] = sum(c.rows_sent for c in self.out_channels.values())
        metrics["batches_out"] = sum(c.batches_sent for c in self.out_channels.values())
        metrics["bytes_out"] = sum(c.bytes_sent for c in self.out_channels.values())
        metrics["backpressure"] = metrics["backpressured_s"] / max(
            time.monotonic() - self.created, 1e-9)
        metrics["pid"] = os.getpid()
        # a source's subtask has no input: the watermark its source emitted stands for it
        watermark = (self.input.watermark if self.source is None
                     else self.source.emitted_watermark)
        metrics["watermark"] = watermark
        if MIN_WATERMARK < watermark < MAX_WATERMARK:
            metrics["watermark_lag_ms"] = time.time() * 1000 - watermark
        metrics["attempt"] = self.spec.attempt
        if self.credits.allowed is not None:  # the credits each sender may hold now
            metrics["credits_allowed"] = self.credits.allowed
        if self.checkpointer is not None:
            metrics.update(self.checkpointer.last_acknowledged)
            metrics["restored_locally"] = float(
                self.checkpointer.restored_from is StateOrigin.LOCAL)
        for operator in self.operators:  # an operator may report its own figures
            for name, value in (operator.metrics() or {}).items():
                metrics[f"{operator.name}.{name}"] = value
        return metrics
