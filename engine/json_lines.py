"""Record batches as JSON lines, one object per row, with Arrow compute kernels.

A Kafka sink writes every batch it gets as JSON. pandas' ``to_json`` costs about
0.4 ms per call whatever the batch's size, which the small batches of a
low-latency job (``buffer_timeout_ms=1``) pay many times a second, and it rounds
floats to 10 significant digits. Here each column becomes a string column with
one vectorized cast and escape, and a row's object is one element-wise join of
those columns and the constant ``{"name":`` pieces: no Python per row.

* integers and booleans as JSON numbers and ``true``/``false``;
* floats in their shortest exact form (a whole number keeps a ``.0``, so a reader
  that infers types still reads a float), NaN and infinities as ``null`` (JSON has
  neither);
* strings escaped as JSON requires (quote, backslash, control characters),
  Unicode as it is;
* binary columns as strings when they are UTF-8 (else an error naming the column);
* timestamps as integer milliseconds since the epoch;
* nulls as ``null``; rarer types (lists, structs, decimals, dates) as pandas'
  ``to_json`` writes them, a column at a time.

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"user": ["a\\"b", None], "n": [1, 2],
    ...                          "x": [0.5, float("nan")], "ok": [True, False]})
    >>> json_lines(batch, where="sink").to_pylist()
    ['{"user":"a\\\\"b","n":1,"x":0.5,"ok":true}', '{"user":null,"n":2,"x":null,"ok":false}']
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute

pc: Any = pyarrow.compute  # its stubs name few of the kernels Arrow generates

# JSON's escapes for the characters it does not allow raw in a string (RFC 8259 7)
_SHORT = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = [(chr(c), _SHORT.get(chr(c), f"\\u{c:04x}")) for c in range(0x20)]
_WHOLE = r"^-?[0-9]+$"  # a float's shortest form that reads back as an integer


class JsonLinesError(ValueError):
    """A column JSON cannot carry."""


def json_lines(batch: pa.RecordBatch, *, where: str) -> pa.Array:
    """One JSON object per row of ``batch`` (a string array; ``where`` names the
    operator in errors)."""
    n = batch.num_rows
    if n == 0:
        return pa.array([], pa.string())
    pieces: list[pa.Array | pa.Scalar] = []
    for i, (field, column) in enumerate(zip(batch.schema, batch.columns)):
        name = json.dumps(field.name, ensure_ascii=False)
        pieces.append(pa.scalar(("{" if i == 0 else ",") + name + ":"))
        pieces.append(_values(field, column, where))
    if not pieces:
        return pa.array(["{}"] * n, pa.string())
    pieces.append(pa.scalar("}"))
    return pc.binary_join_element_wise(*pieces, "")


def _values(field: pa.Field, column: pa.Array, where: str) -> pa.Array:
    """The column's values as JSON text, ``null`` where they are null."""
    kind = field.type
    if pa.types.is_dictionary(kind):
        column, kind = column.dictionary_decode(), kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        text = pc.cast(column, pa.string())
        text = pc.if_else(pc.match_substring_regex(text, _WHOLE),
                          pc.binary_join_element_wise(text, ".0", ""), text)
        text = pc.if_else(finite, text, pa.scalar(None, pa.string()))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = _quoted(column.cast(pa.string()))
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        try:  # JSON has no bytes: UTF-8 text goes as a string
            text = _quoted(column.cast(pa.string()))
        except pa.ArrowInvalid:
            raise JsonLinesError(f"{where}: column '{field.name}' holds bytes that are not "
                                 f"UTF-8, which JSON cannot carry; drop or encode it "
                                 f"first") from None
    elif pa.types.is_timestamp(kind):  # milliseconds since the epoch
        text = pc.cast(column.cast(pa.timestamp("ms")).view(pa.int64()), pa.string())
    else:
        text = _through_pandas(field, column)
    return text.fill_null("null")


def _through_pandas(field: pa.Field, column: pa.Array) -> pa.Array:
    """A column of a rarer type (lists, structs, decimals, dates) as pandas writes it:
    the column alone as ``{"name":value}`` lines, the value cut out of each."""
    table = pa.table({"v": column})
    lines = table.to_pandas().to_json(orient="records", lines=True, force_ascii=False)
    text = pa.array(lines.rstrip("\n").split("\n"), pa.string())
    return pc.utf8_slice_codeunits(text, len('{"v":'), -1)


def _quoted(text: pa.Array) -> pa.Array:
    """Strings as JSON string literals (quotes and escapes; nulls stay null)."""
    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():  # rare: look first
        for raw, escaped in _CONTROL:
            text = pc.replace_substring(text, raw, escaped)
    return pc.binary_join_element_wise('"', text, '"', "")
