"""Sources: ``env.from_source(rs.sources.Sequence(...))`` and friends.

Every source is split-based (Flink FLIP-27): a :class:`Source` lists or
discovers splits through its :class:`SplitEnumerator` (in the job master)
and reads each split with a :class:`SplitReader` (in a source subtask).
"""

from raystream.engine.sources.arrow import ArrowTable
from raystream.engine.sources.base import DEAD_LETTERS, Source, SplitReader
from raystream.engine.sources.collection import Collection
from raystream.engine.sources.files import Files, FileSplitEnumerator, OnError
from raystream.engine.sources.sequence import Sequence
from raystream.engine.sources.split_enumerator import (SplitEnumerator, SplitEnumeratorContext,
                                                       StaticSplitEnumerator)

__all__ = ["ArrowTable", "Collection", "DEAD_LETTERS", "FileSplitEnumerator", "Files", "OnError",
           "Sequence", "Source",
           "SplitEnumerator", "SplitEnumeratorContext", "SplitReader", "StaticSplitEnumerator"]
