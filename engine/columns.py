"""Column names checked when a job is built, before any actor starts.

A stream knows its columns where its source declares them (``from_collection``,
``from_arrow``, ``from_sequence``, Nexmark) and every operator since either keeps them
(``filter``, ``key_by``) or says what it emits (``map(..., schema=)``, a window's
aggregates). Where a user function's output is unknown, nothing is checked here: the
operator names the column and the record at the first batch instead.

    >>> require(["usr"], ("user", "ts"), call="key_by('usr')", stream="clicks")
    Traceback (most recent call last):
    ...
    raystream.engine.errors.SchemaError: key_by('usr'): the stream from 'clicks' has no column 'usr' (its columns: user, ts); did you mean 'user'?
    >>> require(["user"], None, call="key_by('user')", stream="parse")  # unknown: not checked
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from raystream.engine.errors import SchemaError

Columns = tuple[str, ...]


def require(names: Iterable[str], columns: Columns | None, *, call: str, stream: str) -> None:
    """Raise :class:`SchemaError` for the first of ``names`` not among ``columns`` (None:
    the stream's columns are not known when the job is built)."""
    if columns is None:
        return
    for name in names:
        if name not in columns:
            close = difflib.get_close_matches(name, columns, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise SchemaError(
                f"{call}: the stream from '{stream}' has no column '{name}' (its columns: "
                f"{', '.join(columns) or 'none'}){hint}", column=name, columns=columns)


def described(names: Iterable[str]) -> str:
    """Column names as a call's argument shows them: ``'a'`` or ``['a', 'b']``."""
    names = list(names)
    return repr(names[0]) if len(names) == 1 else repr(names)
