"""Python scalar functions for SQL, vectorized: the function takes one Arrow array per
argument (a constant argument repeated to the batch's length) and returns an array of
as many rows, of ``result_type`` (a SQL type name or an Arrow type).

Register one with ``env.create_temporary_function(name, fn)``, or name its module path
in ``CREATE FUNCTION name AS 'package.module.function' LANGUAGE PYTHON`` (the module is
imported on the driver when the statement runs, as a Python import: only code the job's
author names).

    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> @udf(result_type="BIGINT")
    ... def count_char(text: pa.Array, char: pa.Array) -> pa.Array:
    ...     return pc.count_substring(text, char[0].as_py())
    >>> count_char.result_type, count_char(pa.array(["abca"]), pa.array(["a"])).to_pylist()
    (DataType(int64), [2])
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import ParseError

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import arrow_type
from raystream.engine.sql.column_types import sql_type
from raystream.engine.sql.dialect import Flink


@dataclass(frozen=True)
class ScalarFunction:
    """A vectorized Python function SQL can call (see the module's docstring)."""

    function: Callable[..., pa.Array]
    result_type: pa.DataType
    name: str

    def __call__(self, *columns: pa.Array) -> pa.Array:
        return self.function(*columns)


def _arrow(result_type: str | pa.DataType, where: str) -> pa.DataType:
    if isinstance(result_type, pa.DataType):
        return result_type
    try:
        parsed = exp.DataType.build(result_type, dialect=Flink())
    except ParseError:
        raise SqlError(f"{where}: result_type {result_type!r} is not a SQL type") from None
    return arrow_type(sql_type(parsed))


def udf(function: Callable[..., pa.Array] | None = None, *,
        result_type: str | pa.DataType) -> ScalarFunction | Callable[[Callable[..., pa.Array]], ScalarFunction]:
    """Make ``function`` a SQL scalar function returning ``result_type`` (``"BIGINT"``,
    ``"DECIMAL(10, 2)"``, ``pa.float64()``, ...); as a decorator, ``@rs.udf(result_type=...)``."""
    def wrap(fn: Callable[..., pa.Array]) -> ScalarFunction:
        name = getattr(fn, "__name__", "udf")
        return ScalarFunction(fn, _arrow(result_type, f"udf({name})"), name)
    return wrap(function) if function is not None else wrap


def imported(target: str, name: str) -> ScalarFunction:
    """The function ``CREATE FUNCTION name AS 'module.attribute' LANGUAGE PYTHON`` names."""
    module_name, _, attribute = target.rpartition(".")
    where = f"CREATE FUNCTION {name} AS '{target}'"
    if not module_name:
        raise SqlError(f"{where}: name the function as 'package.module.function'")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SqlError(f"{where}: cannot import it ({error})") from None
    if not isinstance(found, ScalarFunction):
        raise SqlError(f"{where}: {target} is not a SQL function; make it one with "
                       f"@raystream.udf(result_type=...)")
    return found
