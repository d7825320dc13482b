"""A subtask's side of checkpoints (Flink's ``SubtaskCheckpointCoordinatorImpl``).

For checkpoint ``n``, always in this order, on the mailbox thread:

1. ``prepare_snapshot_pre_barrier(n)`` on every operator, head to tail —
   records they emit land before the barrier;
2. barrier ``n`` to every output channel, on the control lane, carrying the
   last sequence number before it on that channel (an unaligned barrier: the
   last one *sent*; what is still queued becomes output channel state);
3. the synchronous snapshot of every operator (cheap, consistent copies);

then, on one background thread (so checkpoints are acknowledged in order):

4. the asynchronous part — serialize and write every operator's state to
   checkpoint storage; for an unaligned checkpoint wait until the channel
   state is complete (input still in flight has arrived, an aligned barrier
   queued behind data was sent or turned unaligned) and write it too — and
   the acknowledgement to the coordinator with the state handles and the
   checkpoint's statistics, or a decline with the reason if anything failed.

It also reads a restored checkpoint's state for the chain's operators and
the subtask's channel state.
"""

from __future__ import annotations

import dataclasses
import concurrent.futures
import time
from dataclasses import dataclass

import numpy as np

from raystream.actors.channel_state import (InputStateRecorder, OutputStateCapture,
                                            resolve_batches)
from raystream.checkpoint.barrier import Barrier
from raystream.actors.master_gateway import MasterGateway
from raystream.actors.channel_state_file import (ChannelStateContents, channel_state_key,
                                                     decode_channel_state, encode_channel_state)
from raystream.checkpoint.disk_incremental import RestoredDb
from raystream.checkpoint.handles import IncrementalHandle, OperatorSubtaskState
from raystream.checkpoint.heap_changelog import Chain, restored_chain
from raystream.checkpoint.keygroups import key_group_range
from raystream.checkpoint.local_recovery import (PROCESS_COPY, LocalStateCopy, RecordingStorage,
                                                 StateOrigin, SubtaskIdentity)
from raystream.checkpoint.metadata import RowCounts
from raystream.checkpoint.restore import OperatorRestore, RestoreSpec
from raystream.checkpoint.sections import decode_sections, encode_sections
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.checkpoint.state_backend import StateBackend, StateBackendChoice
from raystream.checkpoint.storage import (CheckpointStorage, StateHandle, safe_name,
                                          snapshot_destination)
from raystream.checkpoint.watermark_floors import WatermarkFloors, runs_of
from raystream.core.failpoints import Failpoints
from raystream.actors.operator import (CountsReadRows, CountsWrittenRows, Operator, OperatorSnapshot, RestoredState,
                                       call_operator)


@dataclass
class CheckpointingSpec:
    """What a subtask needs to take part in checkpoints."""

    storage_uri: str
    job_key: str
    # unaligned checkpoints: received batches are processed in slices of about this
    # many bytes, so a barrier waits for one slice, never a whole message
    slice_bytes: int | None = None
    state_backend: StateBackendChoice = StateBackend.HEAP  # where keyed operators keep state


class _ChannelStateAborted(Exception):
    """The checkpoint was aborted while its channel state was still being recorded."""


class SubtaskCheckpointer:
    """A subtask's part in checkpoints: restoring its operators, and per checkpoint, the
    operators' step before the barrier goes on (:meth:`prepare`), then their snapshot
    and its write (:meth:`snapshot`). The subtask forwards the barrier between the two:
    the barrier's path goes one way, subtask to checkpointer, never back."""

    def __init__(self, *, spec: CheckpointingSpec, names: list[str], operators: list[Operator],
                 vertex_id: int, vertex_name: str, index: int, parallelism: int,
                 max_parallelism: int, attempt: int, failpoints: Failpoints,
                 gateway: MasterGateway, local_copy: LocalStateCopy = PROCESS_COPY) -> None:
        self.spec = spec
        self.gateway = gateway
        self.names = names
        self.operators = operators
        self.vertex_id, self.index, self.attempt = vertex_id, index, attempt
        self.channel_state_key = channel_state_key(vertex_name, index)
        self.key_groups = key_group_range(index, parallelism, max_parallelism)
        # local recovery: what this subtask writes is also kept in its process, for the
        # next attempt on the same actor (checkpoint/local_recovery.py)
        self.local_copy = local_copy
        local_copy.bind(SubtaskIdentity(spec.storage_uri, spec.job_key, vertex_name, index,
                                        self.key_groups))
        self.storage: CheckpointStorage = RecordingStorage(spec.storage_uri, local_copy)
        self.restored_from = StateOrigin.NONE
        self._local_files: frozenset[str] = frozenset()  # own files of the restore, kept here
        self.bytes_from_storage = 0  # what the restore read from storage
        self.max_parallelism = max_parallelism
        # restored watermarks of our key groups that our own watermark has not passed yet
        self.watermark_floors: np.ndarray | None = None
        self.restored_floors: WatermarkFloors | None = None  # every key group's, once restored
        self.failpoints = failpoints
        self.last_checkpoint_id = 0
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        self.sync_pause_s = 0.0  # the last checkpoint's synchronous part
        self.last_acknowledged: dict[str, float] = {}  # figures of the last checkpoint acknowledged
        self._channel_parts: list[InputStateRecorder | OutputStateCapture] = []

    # -- restore ----------------------------------------------------------------------
    def restore(self, restore: RestoreSpec | None) -> ChannelStateContents | None:
        """Initialize every operator's state; return this subtask's channel state, if any."""
        floors = self.restored_floors = self._restored_floors(restore)
        if restore is None:
            for operator in self.operators:
                call_operator(operator, "initialize_state", None)
            return None
        source = CheckpointStorage(restore.storage_uri)
        self._local_files = self._local_restore(restore)
        # the files of the heap chains the next checkpoints extend, as read from storage:
        # kept in the local copy, so that a failure after the next checkpoint restores
        # locally (that checkpoint's chain still names them)
        continued_files: list[tuple[StateHandle, bytes]] = []
        for name, operator in zip(self.names, self.operators):
            files = restore.operators.get(name, OperatorRestore())
            chains = [h for h in files.keyed_db if h.is_heap_chain]
            continued = self._continued_chain(source, chains)
            state = RestoredState(
                restore.checkpoint_id,
                [self._read(source, h) for h in files.operator_state],
                self._keyed_sections(source, files.keyed_state, chains,
                                     continued_files if continued is not None else None),
                floors,
                self._keyed_dbs(source, [h for h in files.keyed_db if not h.is_heap_chain]),
                continued)
            self.last_checkpoint_id = restore.checkpoint_id
            call_operator(operator, "initialize_state", state)
        contents = None
        if self.channel_state_key in restore.channel_state:
            blob = self._read(source, restore.channel_state[self.channel_state_key])
            contents = decode_channel_state(blob, self.attempt)
        local = bool(self._local_files)
        self.restored_from = StateOrigin.LOCAL if local else StateOrigin.STORAGE
        self.local_copy.restored(restore.checkpoint_id, local, continued_files)
        return contents

    def _local_restore(self, restore: RestoreSpec) -> frozenset[str]:
        """This subtask's own files of ``restore`` if the local copy has them all and may
        serve it (its own storage, every file of the restore checksummed as kept here;
        the copy is bound to this subtask's key groups): empty if not. A RocksDB database
        restores from its files, never from here."""
        if restore.storage_uri != self.spec.storage_uri or any(
                not h.is_heap_chain for files in restore.operators.values()
                for h in files.keyed_db if self._overlaps(h)):
            return frozenset()
        own = self.local_copy.own_files(restore.checkpoint_id)
        if not own:
            return frozenset()
        handles = {h.path: h for files in restore.operators.values()
                   for h in (*files.operator_state, *files.keyed_state,
                             *(f for c in files.keyed_db for f in c.files))}
        handles.update((h.path, h) for h in restore.channel_state.values())
        if not all(path in handles and self.local_copy.lookup(handles[path]) is not None
                   for path in own):
            return frozenset()  # another checkpoint's files than the copy's, or changed
        return own

    def _read(self, storage: CheckpointStorage, handle: StateHandle) -> bytes:
        """A restored file: this subtask's own from the local copy, others' from storage."""
        if handle.path in self._local_files:
            data = self.local_copy.lookup(handle)
            if data is not None:
                return data
        self.bytes_from_storage += handle.size
        return storage.read_state(handle)

    def _restored_floors(self, restore: RestoreSpec | None) -> WatermarkFloors | None:
        """The chain's watermark per key group at the restored checkpoint (all operators
        of a chain had reached the head's input watermark)."""
        restored = restore.watermarks.get(self.names[0]) if restore is not None else None
        if restored is None:
            return None
        floors = WatermarkFloors.from_json(restored, max_parallelism=self.max_parallelism)
        mine = floors.of_groups(self.key_groups)
        self.watermark_floors = mine
        return floors

    def _watermark_runs(self, watermark: int) -> list[list[int]]:
        """What the checkpoint records as this subtask's event time, per key group: its
        watermark, or a restored floor it has not passed yet."""
        floors = self.watermark_floors
        if floors is not None and watermark >= floors.max():
            floors = self.watermark_floors = None
        if floors is None:
            return [[self.key_groups.start, self.key_groups.stop - 1, watermark]]
        return runs_of(self.key_groups, np.maximum(floors, watermark))

    def _overlaps(self, handle: IncrementalHandle) -> bool:
        groups, mine = handle.key_groups, self.key_groups
        return max(mine.start, groups.start) < min(mine.stop, groups.stop)

    def _own_shared_dir(self, storage: CheckpointStorage) -> str | None:
        """The job's shared directory if ``storage`` (restored from) is its own storage."""
        return (self.storage.shared_dir(self.spec.job_key)
                if storage.uri == self.storage.uri else None)

    def _keyed_dbs(self, storage: CheckpointStorage,
                   handles: list[IncrementalHandle]) -> list[RestoredDb]:
        """The manifests of the databases whose key groups overlap ours."""
        own = self._own_shared_dir(storage)
        return [RestoredDb.read(storage, h.doc, own) for h in handles if self._overlaps(h)]

    def _continued_chain(self, storage: CheckpointStorage,
                         chains: list[IncrementalHandle]) -> Chain | None:
        """The heap chain the next checkpoint may extend: the one this subtask restores
        whole, if it is its own job's (see heap_changelog.restored_chain)."""
        mine = [chain for chain in chains if self._overlaps(chain)]
        return (restored_chain(mine[0].doc, key_groups=self.key_groups,
                               own_shared_dir=self._own_shared_dir(storage))
                if len(mine) == 1 else None)

    def _keyed_sections(self, storage: CheckpointStorage, handles: list[StateHandle],
                        chains: list[IncrementalHandle],
                        read_chain: list[tuple[StateHandle, bytes]] | None):
        """Our key groups' sections: of the state files, then of every heap chain that
        overlaps ours, file by file in the chain's order (full, then changes); the chain
        files read from storage also go to ``read_chain`` (None: nowhere)."""
        for handle in handles:
            yield from decode_sections(self._read(storage, handle), self.key_groups)
        for chain in chains:
            if self._overlaps(chain):
                for handle in chain.files:
                    data = self._read(storage, handle)
                    if read_chain is not None:
                        read_chain.append((handle, data))
                    yield from decode_sections(data, self.key_groups)

    # -- checkpoint n -------------------------------------------------------------------
    def prepare(self, barrier: Barrier) -> None:
        """Step 1, before the barrier goes downstream: each operator's
        ``prepare_snapshot_pre_barrier`` (Flink's), which may still emit."""
        n = barrier.checkpoint_id
        self.last_checkpoint_id = n
        for operator in self.operators:
            call_operator(operator, "prepare_snapshot_pre_barrier", n)

    def snapshot(self, barrier: Barrier, *, started: float, watermark: int,
                 output_state: OutputStateCapture | None,
                 input_state: InputStateRecorder | None = None,
                 alignment_s: float = 0.0) -> None:
        """Step 3 on the mailbox thread, once the barrier is forwarded (step 2, the
        subtask's: ``output_state`` is what it captured); step 4, the write and the
        acknowledgement, queued on the snapshot thread.

        ``started``: when step 1 began (the synchronous pause is timed from it);
        ``watermark`` is the subtask's input watermark at the barrier; it goes into the
        checkpoint so a restored job does not go back in event time. ``input_state``
        records the input in flight (unaligned at this subtask); ``alignment_s``: how
        long the subtask waited for barriers.
        """
        # the trigger's time is the coordinator's wall clock: one machine's, or synced ones'
        since_trigger_s = time.time() - barrier.trigger_ts_ms / 1000
        n = barrier.checkpoint_id
        parts = [p for p in (input_state, output_state) if p is not None]
        self._channel_parts = [p for p in self._channel_parts if not p.done.is_set()] + parts
        self.failpoints.hit("in_snapshot", final=barrier.kind.is_final)
        snapshots = [(name, call_operator(op, "snapshot_state", n))
                     for name, op in zip(self.names, self.operators)]
        self.sync_pause_s = time.perf_counter() - started
        stats = SnapshotStats(watermarks=self._watermark_runs(watermark), alignment_s=alignment_s,
                              start_delay_s=max(0.0, since_trigger_s - alignment_s),
                              sync_s=self.sync_pause_s, rows=self._row_counts())
        self._writer.submit(self._write_and_acknowledge, barrier, snapshots, started, stats,
                            input_state, output_state)

    def _row_counts(self) -> RowCounts:
        """What its sources read and its data sinks took in this attempt, now."""
        return RowCounts(
            read=sum(op.records_read for op in self.operators if isinstance(op, CountsReadRows)),
            written=sum(op.records_written for op in self.operators
                        if isinstance(op, CountsWrittenRows)))

    def cancel_channel_state(self, upto: int | None = None) -> None:
        """Checkpoints up to ``upto`` (all: None) were aborted: stop waiting for their
        channel state."""
        for part in self._channel_parts:
            if upto is None or part.checkpoint_id <= upto:
                part.cancel()

    def _write_and_acknowledge(self, barrier: Barrier, snapshots, started: float,
                               stats: SnapshotStats,
                               input_state: InputStateRecorder | None,
                               output_state: OutputStateCapture | None) -> None:
        n = barrier.checkpoint_id
        try:
            self.failpoints.hit("in_async_write", final=barrier.kind.is_final)
            written: dict[str, OperatorSubtaskState] = {}
            size = 0
            for name, snapshot in snapshots:
                if snapshot is None:
                    continue
                state = self._write_operator(barrier, name, snapshot)
                size += state.uploaded
                written[name] = state
            try:
                channel_state = self._write_channel_state(n, input_state, output_state)
            except _ChannelStateAborted:
                return  # aborted while the channel state was completing: nothing to acknowledge
            stats = dataclasses.replace(
                stats, channel_state=channel_state, channel_state_key=self.channel_state_key,
                unaligned=input_state is not None or (
                    output_state is not None and output_state.unaligned))
            duration_s = time.perf_counter() - started
            stats = dataclasses.replace(stats, size=size + stats.channel_state_bytes,
                                        duration_s=duration_s, async_s=duration_s - stats.sync_s)
            # The figures first: the acknowledgement may complete the job's last checkpoint,
            # and the job then reads every subtask's metrics at once.
            self.last_acknowledged = {
                "checkpoint_id": n, "checkpoint_size": stats.size,
                "checkpoint_alignment_s": stats.alignment_s,
                "checkpoint_duration_s": stats.duration_s,
                "checkpoint_sync_pause_s": self.sync_pause_s}
            if not barrier.kind.is_savepoint:
                self.local_copy.acknowledged(n, own_handles(written, channel_state))
            self.gateway.acknowledge_checkpoint(n, written, stats)
        except Exception as exc:  # storage unwritable, serialization failed, ...
            self.gateway.decline_checkpoint(n, f"{type(exc).__name__}: {exc}")

    def _write_channel_state(self, n: int, input_state: InputStateRecorder | None,
                             output_state: OutputStateCapture | None) -> StateHandle | None:
        """Wait for the channel state, write it; its handle, None if empty. Raises
        :class:`_ChannelStateAborted` if the checkpoint was aborted meanwhile."""
        inputs, outputs = {}, {}
        if input_state is not None:
            if not input_state.wait():
                raise _ChannelStateAborted(n)
            inputs = {c: resolve_batches(e) for c, e in input_state.entries().items() if e}
        if output_state is not None:
            if not output_state.wait():
                raise _ChannelStateAborted(n)
            outputs = {c: resolve_batches(e) for c, e in output_state.entries.items() if e}
        if not inputs and not outputs:
            return None
        blob = encode_channel_state(inputs, outputs)
        handle = self.storage.write_state(self.spec.job_key, n,
                                          f"{safe_name(self.channel_state_key)}.channels", blob)
        return handle

    def _write_operator(self, barrier: Barrier, name: str,
                        snapshot: OperatorSnapshot) -> OperatorSubtaskState:
        n, stem = barrier.checkpoint_id, f"{safe_name(name)}-{self.index}"
        state_storage, state_job = snapshot_destination(self.storage, self.spec.job_key,
                                                        barrier.savepoint_target)
        if snapshot.make_durable is not None:  # output handed over before the barrier
            snapshot.make_durable()
        operator_state = keyed_state = keyed_db = None
        if snapshot.operator_state is not None:
            operator_state = state_storage.write_state(state_job, n, f"{stem}.op",
                                                       snapshot.operator_state())
        if snapshot.keyed_db is not None and not barrier.kind.is_savepoint:
            # (a savepoint: keyed_state() below writes the database whole, as sections)
            keyed_db = IncrementalHandle.from_json(
                snapshot.keyed_db.upload(self.storage, self.spec.job_key, n, stem))
        if snapshot.keyed_state is not None:
            keyed_state = state_storage.write_state(state_job, n, f"{stem}.keyed",
                                                    encode_sections(snapshot.keyed_state()))
        return OperatorSubtaskState(operator_state, keyed_state, keyed_db)

    def notify_complete(self, checkpoint_id: int) -> None:
        self.local_copy.completed(checkpoint_id)
        for operator in self.operators:
            call_operator(operator, "notify_checkpoint_complete", checkpoint_id)

    def notify_aborted(self, checkpoint_id: int) -> None:
        for operator in self.operators:
            call_operator(operator, "notify_checkpoint_aborted", checkpoint_id)

    def close(self) -> None:
        self.cancel_channel_state()
        self._writer.shutdown(wait=False, cancel_futures=True)



def own_handles(written: dict[str, OperatorSubtaskState],
                channel_state: StateHandle | None) -> list[StateHandle]:
    """The files a checkpoint's state of one subtask needs (a heap chain's earlier ones
    too): what its local copy keeps once the checkpoint completes."""
    handles = [h for state in written.values() for h in (
        state.operator_state, state.keyed_state) if h is not None]
    handles += [f for state in written.values() if state.keyed_db is not None
                and state.keyed_db.is_heap_chain for f in state.keyed_db.files]
    return handles + ([channel_state] if channel_state is not None else [])
