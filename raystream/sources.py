"""Sources: ``env.from_source(rs.sources.Sequence(...))`` and friends."""

from raystream.engine.sources.arrow import ArrowTable
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.sources.collection import Collection
from raystream.engine.sources.files import Files
from raystream.engine.sources.sequence import Sequence

__all__ = ["ArrowTable", "Collection", "Files", "Sequence", "Source", "SplitReader"]
