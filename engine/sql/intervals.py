"""SQL interval literals as milliseconds: the one place that converts them."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from raystream.engine.errors import SqlError

# a day-time interval's fields, largest first, and their milliseconds (year-month intervals
# have no fixed length: a window cannot be one)
_UNITS = {"DAY": 86_400_000, "HOUR": 3_600_000, "MINUTE": 60_000, "SECOND": 1_000}
_FIELD = re.compile(r"\d+(\.\d*)?|\.\d+")


def interval_ms(interval: exp.Interval) -> int:
    """The milliseconds of an interval literal: a unit (SECOND, MINUTE, HOUR, DAY; plurals
    too) or a span such as ``DAY TO SECOND`` (``'1 02:03:04.5'``); a sign may lead the
    string. Not a whole number of milliseconds, or a year-month unit: ``SqlError``.

    >>> import sqlglot
    >>> from raystream.engine.sql.intervals import interval_ms
    >>> interval_ms(sqlglot.parse_one("INTERVAL '10' SECOND"))
    10000
    >>> interval_ms(sqlglot.parse_one("INTERVAL '0.5' SECOND"))
    500
    >>> interval_ms(sqlglot.parse_one("INTERVAL '1:30' MINUTE TO SECOND"))
    90000
    """
    value = interval.this
    if not isinstance(value, exp.Literal):
        raise SqlError(f"an interval's value must be a literal, not {value.sql() if value else ''!r}")
    text = value.name.strip()
    unit = interval.args.get("unit")
    if isinstance(unit, exp.IntervalSpan):
        first, last = _unit(unit.this), _unit(unit.expression)
    elif isinstance(unit, exp.Var):
        first = last = _unit(unit)
    else:
        raise SqlError(f"interval {interval.sql()!r} needs a unit such as SECOND")
    units = list(_UNITS)
    if units.index(first) > units.index(last):
        raise SqlError(f"interval {interval.sql()!r}: {first} TO {last} is no span")
    span = units[units.index(first):units.index(last) + 1]
    sign = -1 if text.startswith("-") else 1
    fields = re.split(r"[ :]", text.lstrip("+-").strip())
    # (only the last field may have a fraction: '1.5' HOUR, '1:30.25' MINUTE TO SECOND)
    if (len(fields) != len(span) or not all(_FIELD.fullmatch(f) for f in fields)
            or any("." in f for f in fields[:-1])):
        raise SqlError(f"interval {interval.sql()!r}: {text!r} does not read as "
                       f"{' TO '.join(dict.fromkeys((first, last)))}")
    try:
        total = sum((Decimal(f) * _UNITS[u] for f, u in zip(fields, span)), Decimal(0))
    except InvalidOperation:  # (the pattern above lets only numbers through)
        raise SqlError(f"interval {interval.sql()!r} is no number") from None
    if total != total.to_integral_value():
        raise SqlError(f"interval {interval.sql()!r} is not a whole number of milliseconds")
    return sign * int(total)


def _unit(unit: exp.Expr | None) -> str:
    name = unit.name.upper() if unit is not None else ""
    name = name.removesuffix("S") if name.removesuffix("S") in _UNITS else name
    if name not in _UNITS:
        raise SqlError(f"interval unit {name or '?'} is not a fixed duration: use "
                       "SECOND, MINUTE, HOUR or DAY")
    return name
