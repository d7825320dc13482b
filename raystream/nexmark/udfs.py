"""The Nexmark project's user functions, as raystream SQL functions (``CREATE FUNCTION
count_char AS 'raystream.nexmark.udfs.count_char' LANGUAGE PYTHON``, for q14).

    >>> import pyarrow as pa
    >>> count_char(pa.array(["abcc", None]), pa.array(["c", "c"])).to_pylist()
    [2, None]
"""

from __future__ import annotations

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

from raystream.engine.sql.udf import ScalarFunction, udf


def _count_char(text: pa.Array, char: pa.Array) -> pa.Array:
    """How often ``char`` occurs in ``text`` (Nexmark's ``CountChar``), per row."""
    chars = char.unique()
    if len(chars) == 1 and chars[0].is_valid:  # the usual case: one constant character
        return pc.cast(pc.count_substring(text, chars[0].as_py()), pa.int64())  # pyright: ignore[reportAttributeAccessIssue]
    return pa.array([None if t is None or c is None else t.count(c)
                     for t, c in zip(text.to_pylist(), char.to_pylist())], pa.int64())


count_char: ScalarFunction = udf(_count_char, result_type="BIGINT")  # pyright: ignore[reportAssignmentType]
