"""The RocksDB of the disk keyed state backend: its options and how it is opened and removed.

:class:`DiskStateOptions` selects the disk backend (``CheckpointConfig(state_backend=...)``)
and sizes its memory; the functions here open the database with those settings, hand
freed memory back and remove directories left behind. The backend that keeps its state in
the database is :mod:`raystream.checkpoint.disk_state`.

Why rocksdict
-------------
``rocksdict`` binds RocksDB through Rust (``rust-rocksdb``) and ships wheels
that bundle RocksDB itself: no system library, no compiler on the workers, the
same engine on every machine. It exposes what this backend needs and nothing
in Python per entry: raw-bytes mode, point and multi gets, write batches,
point-in-time range iterators with bounds, block cache and write-buffer
sizing.

Directories
-----------
One RocksDB per operator instance, in a fresh directory under
:attr:`DiskStateOptions.local_dir` (the system temp dir by default), removed
when the backend is closed or garbage-collected; directories of dead processes
(a killed subtask) are removed by the next backend that opens in the same
directory (:func:`remove_stale`). The local database is never recovered from: after a
failure state comes from the job's checkpoint, so the write-ahead log is off.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

__all__ = ["DiskStateOptions", "dispose_db", "open_db", "raw_read_options", "remove_stale",
           "return_freed_memory"]

_MEMTABLE_BLOOM_RATIO = 0.1
# A memtable is a skiplist: a get or a put walks it with a cache miss a level, so a
# big one is slow, and an incremental checkpoint flushes it every interval anyway.
# RocksDB's default size; the budget beyond goes to the block cache (keyed reduce
# batches updating 2M keys, a flush every 1.17M rows, sorted writes below too, on a
# loaded machine: 172-174k rows per CPU second against 157-170k with a sixth of 2 GB)
_MAX_MEMTABLE_BYTES = 64 << 20


@dataclass(frozen=True)
class DiskStateOptions:
    """The disk backend with its settings, for ``CheckpointConfig(state_backend=...)``.

    Args:
        memory_mb: memory RocksDB may use per operator instance (subtask): two
            memtables of a sixth of it each, at most 64 MB, and the rest block cache.
        local_dir: where each instance creates its database directory (the
            system temp dir if None); a local disk, not checkpoint storage.
        incremental: checkpoints upload only the RocksDB files that are new since
            the previous completed checkpoint (:mod:`raystream.checkpoint.disk_incremental`);
            savepoints stay full. Off by default: a restore then reads more files,
            and the job's storage holds files shared between checkpoints.

    >>> DiskStateOptions(memory_mb=128).block_cache_bytes
    89478487
    >>> DiskStateOptions(memory_mb=2048).block_cache_bytes >> 20
    1907
    >>> DiskStateOptions(memory_mb=4)
    Traceback (most recent call last):
    ...
    ValueError: disk state backend: memory_mb must be >= 8, got 4
    """

    memory_mb: int = 64
    local_dir: str | None = None
    incremental: bool = False

    def __post_init__(self) -> None:
        if self.memory_mb < 8:
            raise ValueError(f"disk state backend: memory_mb must be >= 8, got {self.memory_mb}")

    @property
    def kind(self) -> str:
        return "disk"

    @property
    def block_cache_bytes(self) -> int:
        """What the two memtables and their bloom filters leave of the budget."""
        return self.memory_mb * (1 << 20) - int(2 * self.write_buffer_bytes
                                                * (1 + _MEMTABLE_BLOOM_RATIO))

    @property
    def write_buffer_bytes(self) -> int:
        """Size of one memtable: with its bloom filter a sixth of the budget, at most
        :data:`_MAX_MEMTABLE_BYTES` (two may exist at once)."""
        return min(int(self.memory_mb * (1 << 20) / 6 / (1 + _MEMTABLE_BLOOM_RATIO)),
                   _MAX_MEMTABLE_BYTES)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(parent: str) -> None:
    """Remove database directories left by processes that are gone (a killed subtask)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) == 4 and parts[:2] == ["raystream", "state"] and parts[2].isdigit():
            if not _pid_alive(int(parts[2])):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def open_db(path: str, options: DiskStateOptions, cache: Any = None):
    """Open (or create) the database at ``path``; ``cache``, a ``rocksdict.Cache``, is
    its block cache (a new one of the options' size if None)."""
    import rocksdict

    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache if cache is not None else rocksdict.Cache(options.block_cache_bytes))
    table.set_cache_index_and_filter_blocks(True)  # counted in the budget
    table.set_bloom_filter(10, False)  # point gets dominate
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(options.write_buffer_bytes)
    opts.set_max_write_buffer_number(2)
    opts.set_db_write_buffer_size(options.write_buffer_bytes * 2)
    # A bloom filter over each memtable's whole keys (a tenth of its size): a get of a key
    # the memtable lacks, most gets between two flushes, skips the skiplist walk, a cache
    # miss per level (a batch of keyed reduce, 1M keys: 20% more rows/s)
    opts.set_memtable_prefix_bloom_ratio(_MEMTABLE_BLOOM_RATIO)
    opts.set_memtable_whole_key_filtering(True)
    opts.set_max_background_jobs(2)
    # Every SST file is uploaded by an incremental checkpoint, and gets hit the block
    # cache's uncompressed blocks, so file size matters more than decompression speed:
    # ZSTD at level 1 (window bits, level, strategy, dictionary bytes), not RocksDB's
    # Snappy (keyed rows {key, value, i}: 16.2 SST bytes an entry against 22.0, for 14%
    # more CPU writing and compacting them)
    opts.set_compression_type(rocksdict.DBCompressionType.zstd())
    opts.set_compression_options(-14, 1, 0, 0)
    # TTL through compaction: deleting expired entries leaves tombstones; an SST with
    # many (64 in any 128 consecutive entries, or half of it) is compacted, so the
    # space is reclaimed (rocksdict has no compaction filter to drop expired values)
    opts.add_compact_on_deletion_collector_factory(128, 64, 0.5)
    # Keys are hashed, so every flush (one per incremental checkpoint) is an L0 file over
    # the whole key range, and each L0->L1 compaction rewrites all of L1, which the next
    # checkpoint uploads again: gather 16 L0 files rather than RocksDB's 4 first (a third
    # of the bytes uploaded, bench/large_state.py; point gets stay cheap: bloom filters)
    opts.set_level_zero_file_num_compaction_trigger(16)
    opts.set_level_zero_slowdown_writes_trigger(32)
    opts.set_level_zero_stop_writes_trigger(48)
    # An existing database (a restore adopts a checkpoint's) is opened with the options
    # its OPTIONS file lists unless a column family's are given: those lack the block
    # cache and the bloom filter (an 8 MB cache, no filters: a restored subtask ran a
    # keyed reduce at a quarter of its rate before the failure)
    db = rocksdict.Rdict(path, opts, column_families={"default": opts})
    # State is recovered from checkpoints, never from the local database: no WAL.
    write = rocksdict.WriteOptions()
    # a property (rocksdict's stub calls it a method)
    write.disable_wal = True  # pyright: ignore[reportAttributeAccessIssue]
    db.set_write_options(write)
    return db


def return_freed_memory() -> None:
    """Hand memory the C heap freed back to the operating system (glibc's
    ``malloc_trim``; nothing elsewhere). glibc keeps freed blocks for reuse: an emptied
    block cache of 500 MB left the resident size where it was until trimmed (795 MB,
    then 245 MB)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


def raw_read_options():
    """Read options for a raw-mode database (0.3.29 takes no ``raw_mode`` argument:
    its iterator bounds are raw bytes; newer releases may ask for it)."""
    import rocksdict

    try:
        return rocksdict.ReadOptions(raw_mode=True)  # pyright: ignore[reportCallIssue]
    except TypeError:
        return rocksdict.ReadOptions()


def dispose_db(db: Any, path: str) -> None:
    """Close ``db`` and remove its directory ``path`` (the backend's finalizer)."""
    try:
        db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
