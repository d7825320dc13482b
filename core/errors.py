"""The base of raystream's own errors (the errors a user sees are in
:mod:`raystream.engine.errors`; lower layers derive theirs from this one)."""

from __future__ import annotations


class RaystreamError(Exception):
    """Base of raystream's own errors."""
