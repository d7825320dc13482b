"""Flink SQL text into raystream's typed statements (:mod:`raystream.engine.sql.ast`).

sqlglot (with :class:`~raystream.engine.sql.dialect.Flink`) reads each statement; what
spans statements (``EXECUTE STATEMENT SET BEGIN ... END``, ``BEGIN STATEMENT SET; ...
END;``) and prefixes them (``EXPLAIN``) is read here from the tokens, since sqlglot splits
a script at every semicolon before it parses.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import replace
from typing import cast

from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType

from raystream.engine.errors import SqlError
from raystream.engine.sql.ast import (Column, ComputedColumn, CreateFunction, CreateTable,
                                      CreateView, Explain, FunctionLanguage, Insert,
                                      PhysicalColumn, Query, Statement, StatementSet,
                                      Watermark)
from raystream.engine.sql.column_types import sql_type
from raystream.engine.sql.dialect import Flink

_DIALECT = Flink()
_WORDS = (TokenType.IDENTIFIER, TokenType.STRING)  # tokens that are never keywords


def parse(text: str) -> list[Statement]:
    """The statements of a SQL script, in order. Anything that does not parse, or that
    raystream's SQL does not have, is a ``SqlError`` naming line and column.

    >>> from raystream.engine.sql import parse
    >>> create, insert = parse('''
    ...     CREATE TABLE bid (auction BIGINT, price BIGINT, ts TIMESTAMP(3),
    ...                       WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
    ...     WITH ('connector' = 'nexmark');
    ...     INSERT INTO out SELECT auction, COUNT(*) AS bids
    ...     FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(ts), INTERVAL '10' SECOND))
    ...     GROUP BY auction, window_start, window_end;''')
    >>> [column.name for column in create.columns], create.option("connector")
    (['auction', 'price', 'ts'], 'nexmark')
    >>> from raystream.engine.sql import WindowTableFunction
    >>> insert.query.find(WindowTableFunction).window
    WindowTvf(kind=<WindowKind.TUMBLE: 'TUMBLE'>, table='bid', time_column='ts', size_ms=10000, \
slide_ms=None, step_ms=None, gap_ms=None, offset_ms=0, partition_by=())
    >>> parse("SELECT a FROM t WHERE")
    Traceback (most recent call last):
    ...
    raystream.engine.errors.SqlError: line 1, column 22: expected an expression after WHERE
    """
    try:
        tokens = _DIALECT.tokenize(text)
    except TokenError as error:
        raise _token_error(text, error) from None
    unknown = next((t for t in tokens if t.token_type == TokenType.UNKNOWN), None)
    if unknown is not None:
        hint = " (strings are in single quotes, names in backticks)" if unknown.text == '"' else ""
        raise _error(text, f"unexpected character {unknown.text!r}{hint}", unknown.start)
    chunks = deque(_split(tokens))
    statements = []
    while chunks:
        statements.append(_statement(chunks, text))
    return statements


def _token_error(text: str, error: TokenError) -> SqlError:
    # sqlglot's own message quotes 100 characters around the place; its cause names it
    cause = error.__cause__
    missing = re.fullmatch(r"Missing (.+) from \d+:(\d+)", str(cause)) if cause else None
    if missing:
        return _error(text, f"missing the closing {missing[1]}", int(missing[2]))
    return _error(text, f"cannot read the text: {cause or error}", error.start or 0)


def _split(tokens: list[Token]) -> list[list[Token]]:
    chunks: list[list[Token]] = [[]]
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            chunks.append([])
        else:
            chunks[-1].append(token)
    return [chunk for chunk in chunks if chunk]


def _starts(chunk: list[Token], *words: str) -> bool:
    return len(chunk) >= len(words) and all(
        token.token_type not in _WORDS and token.text.upper() == word
        for token, word in zip(chunk, words))


def _statement(chunks: deque[list[Token]], text: str) -> Statement:
    chunk = chunks.popleft()
    if _starts(chunk, "EXPLAIN"):
        rest = chunk[3:] if _starts(chunk, "EXPLAIN", "PLAN", "FOR") else chunk[1:]
        if not rest:
            raise _error(text, "expected a statement after EXPLAIN", chunk[-1].end + 1)
        chunks.appendleft(rest)
        return Explain(_statement(chunks, text))
    for opening in (("EXECUTE", "STATEMENT", "SET", "BEGIN"), ("BEGIN", "STATEMENT", "SET"),
                    ("STATEMENT", "SET", "BEGIN")):  # (the last after EXPLAIN)
        if _starts(chunk, *opening):
            return _statement_set(chunk, len(opening), chunks, text)
    if _starts(chunk, "END"):
        raise _error(text, "END without BEGIN STATEMENT SET", chunk[0].start)
    if _starts(chunk, "EXECUTE", "INSERT"):  # Flink's EXECUTE INSERT INTO ...
        chunk = chunk[1:]
    if _starts(chunk, "CREATE", "TEMPORARY", "SYSTEM", "FUNCTION"):  # (sqlglot lacks SYSTEM)
        function = _convert(_parse_one(chunk[:2] + chunk[3:], text), chunk[0], text)
        return replace(cast(CreateFunction, function), system=True)
    return _convert(_parse_one(chunk, text), chunk[0], text)


def _statement_set(opening: list[Token], size: int, chunks: deque[list[Token]],
                   text: str) -> StatementSet:
    if opening[size:]:
        chunks.appendleft(opening[size:])
    inserts = []
    while True:
        if not chunks:
            raise _error(text, "statement set not closed by END", opening[0].start)
        if len(chunks[0]) == 1 and _starts(chunks[0], "END"):
            if not inserts:
                raise _error(text, "a statement set needs an INSERT", chunks[0][0].start)
            chunks.popleft()
            return StatementSet(tuple(inserts))
        first = chunks[0][0]
        statement = _statement(chunks, text)
        if not isinstance(statement, Insert):
            raise _error(text, "a statement set holds INSERT statements only", first.start)
        inserts.append(statement)


def _parse_one(chunk: list[Token], text: str) -> exp.Expr:
    parser = _DIALECT.parser(error_level=ErrorLevel.IMMEDIATE)
    try:
        expressions = parser.parse(chunk, text)
    except ParseError as error:
        details = error.errors[0] if error.errors else {}
        raise _error(text, _describe(details), details.get("start", chunk[0].start)) from None
    return cast(exp.Expr, expressions[0])


def _describe(details: dict[str, object]) -> str:
    """sqlglot's description, in the words of raystream's messages."""
    description = str(details.get("description", "syntax error"))
    highlight = str(details.get("highlight") or "")
    place = "at the end" if details.get("at_end") else f"at {highlight!r}"
    if description.startswith("Expecting "):
        return f"expected {description.removeprefix('Expecting ')!r} {place}"
    if description.startswith("Invalid expression / Unexpected token"):
        return f"unexpected {highlight!r}"
    if description.startswith("Required keyword: 'this' missing for"):
        # (sqlglot's words for a clause that ends where its expression should be)
        kind = description.rsplit(".", 1)[-1].rstrip("'>").upper()
        return f"expected an expression after {kind}"
    got = re.search(r" but got <Token token_type: TokenType\.(\w+), text: (.*?), line: .*>$",
                    description)
    if got:  # (sqlglot names the token by its repr)
        place = "at the end" if got[1] == "SENTINEL" else f"at {got[2]!r}"
        return f"{description[:got.start()][:1].lower()}{description[1:got.start()]} {place}"
    return description


def _error(text: str, message: str, offset: int) -> SqlError:
    line = text.count("\n", 0, offset) + 1
    return SqlError(message, line=line, column=offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _at(node: exp.Expr, fallback: Token) -> int:
    """The offset where a node was written (identifiers know theirs)."""
    identifier = node if isinstance(node, exp.Identifier) else node.find(exp.Identifier)
    start = identifier.meta.get("start") if identifier is not None else None
    return start if isinstance(start, int) else fallback.start


def _name(node: exp.Expr | None) -> str:
    if isinstance(node, exp.Table):
        return ".".join(part.name for part in node.parts)
    return node.name if node is not None else ""


def _convert(expression: exp.Expr, first: Token, text: str) -> Statement:
    if isinstance(expression, exp.Create):
        kind = str(expression.args.get("kind") or "").upper()
        if kind == "TABLE":
            return _create_table(expression, first, text)
        if kind == "VIEW":
            return _create_view(expression, first, text)
        if kind == "FUNCTION":
            return _create_function(expression)
    if isinstance(expression, exp.Insert):
        return _insert(expression, first, text)
    if isinstance(expression, exp.Query):
        return Query(expression)
    raise _error(text, f"unsupported statement {first.text.upper()} (raystream reads CREATE "
                 "TABLE/VIEW/FUNCTION, INSERT, SELECT, EXPLAIN and statement sets)",
                 first.start)


def _properties(expression: exp.Create) -> list[exp.Expr]:
    properties = expression.args.get("properties")
    return list(properties.expressions) if isinstance(properties, exp.Properties) else []


def _create_table(expression: exp.Create, first: Token, text: str) -> CreateTable:
    schema = expression.this
    if not isinstance(schema, exp.Schema):
        raise _error(text, "CREATE TABLE needs its columns (CREATE TABLE ... LIKE and AS "
                     "SELECT are not supported)", first.start)
    columns: list[Column] = []
    watermark = None
    primary_key: tuple[str, ...] = ()
    for element in schema.expressions:
        if isinstance(element, exp.ColumnDef):
            column, column_key = _column(element, first, text)
            columns.append(column)
            primary_key = column_key or primary_key
        elif isinstance(element, exp.WatermarkColumnConstraint):
            watermark = Watermark(_name(element.this), element.expression)
        elif isinstance(element, exp.PrimaryKey):
            primary_key = tuple(_name(key) for key in element.expressions)
        else:
            raise _error(text, f"unsupported table element {element.sql(dialect=_DIALECT)!r}",
                         _at(element, first))
    partitioned_by: tuple[str, ...] = ()
    options: list[tuple[str, str]] = []
    temporary = False
    for prop in _properties(expression):
        if isinstance(prop, exp.PartitionedByProperty):
            names = prop.this.expressions if isinstance(prop.this, exp.Schema) else [prop.this]
            partitioned_by = tuple(_name(name) for name in names)
        elif isinstance(prop, exp.TemporaryProperty):
            temporary = True
        elif isinstance(prop, exp.Property) and isinstance(prop.this, exp.Literal) and (
                isinstance(prop.args.get("value"), exp.Literal)):
            key, value = prop.this.name, cast(exp.Literal, prop.args["value"]).name
            if any(key == k for k, _ in options):
                raise _error(text, f"option {key!r} given twice", _at(prop, first))
            options.append((key, value))
        else:
            raise _error(text, f"unsupported table property {prop.sql(dialect=_DIALECT)!r} "
                         "(options are WITH ('key' = 'value', ...))", first.start)
    names = [column.name for column in columns]
    for name in (*primary_key, *partitioned_by, *([watermark.column] if watermark else [])):
        if name not in names:
            raise _error(text, f"{name!r} is not a column of {_name(schema.this)} (columns: "
                         f"{', '.join(names)})", first.start)
    return CreateTable(_name(schema.this), tuple(columns), watermark, primary_key,
                       partitioned_by, tuple(options), temporary,
                       bool(expression.args.get("exists")))


def _column(element: exp.ColumnDef, first: Token,
            text: str) -> tuple[Column, tuple[str, ...]]:
    """A column, and the primary key when the column declares itself as it."""
    name = element.name
    computed = None
    nullable = True
    key: tuple[str, ...] = ()
    for constraint in element.constraints:
        kind = constraint.args.get("kind")
        if isinstance(kind, exp.ComputedColumnConstraint):
            computed = kind.this
        elif isinstance(kind, exp.NotNullColumnConstraint):
            nullable = bool(kind.args.get("allow_null"))
        elif isinstance(kind, exp.PrimaryKeyColumnConstraint):
            key = (name,)
        else:
            raise _error(text, f"unsupported column constraint {constraint.sql()!r} of "
                         f"column {name!r}", _at(element, first))
    if computed is not None:
        return ComputedColumn(name, computed), key
    data_type = element.args.get("kind")
    if not isinstance(data_type, exp.DataType):
        raise _error(text, f"column {name!r} needs a type", _at(element, first))
    try:
        return PhysicalColumn(name, sql_type(data_type), nullable), key
    except SqlError as error:
        raise _error(text, f"{error} (column {name!r})", _at(element, first)) from None


def _create_view(expression: exp.Create, first: Token, text: str) -> CreateView:
    query = expression.expression
    if not isinstance(query, exp.Query):
        raise _error(text, "CREATE VIEW needs AS SELECT ...", first.start)
    temporary = any(isinstance(p, exp.TemporaryProperty) for p in _properties(expression))
    return CreateView(_name(expression.this), query, temporary,
                      bool(expression.args.get("exists")))


def _create_function(expression: exp.Create) -> CreateFunction:
    properties = _properties(expression)
    language = next((p.name.upper() for p in properties
                     if isinstance(p, exp.LanguageProperty)), "JAVA")
    target = expression.expression
    return CreateFunction(
        _name(expression.this), target.name if isinstance(target, exp.Expr) else "",
        FunctionLanguage(language),
        temporary=any(isinstance(p, exp.TemporaryProperty) for p in properties),
        if_not_exists=bool(expression.args.get("exists")))


def _insert(expression: exp.Insert, first: Token, text: str) -> Insert:
    target = expression.this
    columns: tuple[str, ...] = ()
    if isinstance(target, exp.Schema):
        columns = tuple(_name(column) for column in target.expressions)
        target = target.this
    query = expression.expression
    if not isinstance(query, exp.Query):
        raise _error(text, "INSERT needs a SELECT (VALUES is not supported)", first.start)
    return Insert(_name(target), query, columns, bool(expression.args.get("overwrite")))
