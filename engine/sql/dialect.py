"""Flink SQL as a sqlglot dialect.

Built on sqlglot's generic dialect, not Spark's or Hive's, though those are syntactically
closer (backticks, ``STRING``): their parsers rewrite functions into their own meaning
(Spark turns ``DATE_FORMAT(ts, 'yyyy-MM-dd')`` into strftime's ``'%Y-%mstrict-%dstrict'``),
and the planner needs what Flink means. What Flink adds:

- ``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL ...))`` and HOP, CUMULATE, SESSION
  (``TABLE t PARTITION BY k``), positional or named (``SIZE => ...``), become a
  :class:`WindowTableFunction` node holding a typed :class:`~raystream.engine.sql.ast.WindowTvf`;
- ``ROW<name type, ...>`` / ``ROW(...)`` types (as sqlglot's STRUCT);
- ``WATERMARK FOR col AS expr`` in a table's schema;
- ``SESSION(ts, gap)`` as a function (the legacy group windows of ``GROUP BY``);
- ``REGEXP_EXTRACT(s, regex, group)``: the third argument is the group (generic: position).

Syntax sqlglot would fall back to an opaque ``Command`` for is a parse error here instead,
and every parse error keeps the offset of its token, so that messages name line and column
of the whole text.
"""

from __future__ import annotations

from collections.abc import Collection
from decimal import Decimal
from typing import NoReturn, cast

from sqlglot import exp, generator, parser, tokens
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError
from sqlglot.expressions.core import Expression
from sqlglot.tokenizer_core import Token, TokenType

from raystream.engine.errors import SqlError
from raystream.engine.sql.ast import WindowKind, WindowTvf
from raystream.engine.sql.intervals import interval_ms

# each window function's parameters in positional order, as Flink names them (named
# arguments use these names); OFFSET is optional
_PARAMETERS = {
    WindowKind.TUMBLE: ("DATA", "TIMECOL", "SIZE", "OFFSET"),
    WindowKind.HOP: ("DATA", "TIMECOL", "SLIDE", "SIZE", "OFFSET"),
    WindowKind.CUMULATE: ("DATA", "TIMECOL", "STEP", "SIZE", "OFFSET"),
    WindowKind.SESSION: ("DATA", "TIMECOL", "GAP"),
}
_DURATIONS = {"SIZE": "size_ms", "SLIDE": "slide_ms", "STEP": "step_ms", "GAP": "gap_ms",
              "OFFSET": "offset_ms"}


class WindowTableFunction(Expression):
    """A window table function in a FROM clause: ``window`` is the typed
    :class:`~raystream.engine.sql.ast.WindowTvf`, ``alias`` an optional table alias."""

    arg_types = {"window": True, "alias": False}

    @property
    def window(self) -> WindowTvf:
        return cast(WindowTvf, self.args["window"])


class _Argument:
    """One argument of a window function as written: a table, a descriptor or a duration."""

    def __init__(self, name: str | None, token: Token, *, table: str | None = None,
                 partition_by: tuple[str, ...] = (), column: str | None = None,
                 ms: int | None = None) -> None:
        self.name, self.token = name, token
        self.table, self.partition_by, self.column, self.ms = table, partition_by, column, ms


def _regexp_extract(args: list[exp.Expr]) -> exp.RegexpExtract:
    return exp.RegexpExtract(this=args[0], expression=args[1],
                             group=args[2] if len(args) > 2 else None)


class FlinkParser(parser.Parser):
    FUNC_TOKENS = {*parser.Parser.FUNC_TOKENS, TokenType.SESSION}

    FUNCTIONS = {**parser.Parser.FUNCTIONS, "REGEXP_EXTRACT": _regexp_extract}

    CONSTRAINT_PARSERS = {
        **parser.Parser.CONSTRAINT_PARSERS,
        "WATERMARK": lambda self: self._parse_watermark(),
        "METADATA": lambda self: self._fail(
            "metadata columns (METADATA [FROM ...] [VIRTUAL]) are not supported", self._prev),
    }
    SCHEMA_UNNAMED_CONSTRAINTS = {*parser.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    def _parse_watermark(self) -> exp.WatermarkColumnConstraint:
        if not self._match(TokenType.FOR):
            self._fail("expected FOR after WATERMARK")
        column = self._parse_column()
        if not self._match(TokenType.ALIAS):
            self._fail("expected AS after WATERMARK FOR <column>")
        return self.expression(exp.WatermarkColumnConstraint(
            this=column, expression=self._parse_disjunction()))

    def _parse_types(self, check_func: bool = False, schema: bool = False,
                     allow_identifiers: bool = True,
                     with_collation: bool = False) -> exp.Expr | None:
        # ROW is a type only where a `<` or `(` of fields follows (ROW(1, 2) in an
        # expression is a row constructor, CURRENT ROW a frame bound)
        self._row_as_struct(0, parenthesized=schema)
        return super()._parse_types(check_func=check_func, schema=schema,
                                    allow_identifiers=allow_identifiers,
                                    with_collation=with_collation)

    def _parse_struct_types(self, type_required: bool = False) -> exp.Expr | None:
        # a field's type follows its name (and a colon): ROW(...) there is a type too
        self._row_as_struct(1, parenthesized=True)
        self._row_as_struct(2, parenthesized=True)
        return super()._parse_struct_types(type_required=type_required)

    def _row_as_struct(self, ahead: int, *, parenthesized: bool) -> None:
        """Read the ROW token ``ahead`` of the current one as sqlglot's STRUCT if fields
        follow it (the tokens are this parse's own)."""
        index = self._index + ahead
        if index + 1 >= len(self._tokens):
            return
        token, after = self._tokens[index], self._tokens[index + 1].token_type
        if token.token_type == TokenType.ROW and (
                after == TokenType.LT or (parenthesized and after == TokenType.L_PAREN)):
            token.token_type = TokenType.STRUCT

    def _parse_table(self, schema: bool = False, joins: bool = False,
                     alias_tokens: Collection[TokenType] | None = None, parse_bracket: bool = False,
                     is_db_reference: bool = False, parse_partition: bool = False,
                     consume_pipe: bool = False) -> exp.Expr | None:
        if (self._curr and self._next and self._curr.token_type == TokenType.TABLE
                and self._next.token_type == TokenType.L_PAREN):
            return self._parse_window_table_function()
        return super()._parse_table(
            schema=schema, joins=joins, alias_tokens=alias_tokens, parse_bracket=parse_bracket,
            is_db_reference=is_db_reference, parse_partition=parse_partition,
            consume_pipe=consume_pipe)

    def _parse_window_table_function(self) -> WindowTableFunction:
        self._advance(2)  # TABLE (
        name = self._curr
        kind = WindowKind.__members__.get(name.text.upper()) if name else None
        if name is None or kind is None or name.token_type in (TokenType.STRING,
                                                                  TokenType.IDENTIFIER):
            self._fail("expected TUMBLE, HOP, CUMULATE or SESSION in TABLE(...)")
        self._advance()
        self._match_l_paren()
        arguments = [self._parse_window_argument()]
        while self._match(TokenType.COMMA):
            arguments.append(self._parse_window_argument())
        self._match_r_paren()
        self._match_r_paren()
        window = self._window(kind, name, arguments)
        return self.expression(WindowTableFunction(window=window,
                                                   alias=self._parse_table_alias()))

    def _parse_window_argument(self) -> _Argument:
        named = None
        if self._curr and self._next and self._next.token_type == TokenType.FARROW:
            named = self._curr.text.upper()
            self._advance(2)
        token = self._curr or self._prev
        if self._match(TokenType.TABLE):
            table = self._parse_table_parts()
            if table is None:
                self._fail("expected a table name after TABLE", token)
            partition_by: tuple[str, ...] = ()
            if self._match(TokenType.PARTITION_BY):  # (SESSION only; checked below)
                columns = (self._parse_wrapped_csv(self._parse_column)
                           if self._match(TokenType.L_PAREN, advance=False)
                           else [self._parse_column()])
                partition_by = tuple(column.name for column in columns if column)
            return _Argument(named, token, table=".".join(p.name for p in table.parts),
                             partition_by=partition_by)
        if self._match_text_seq("DESCRIPTOR"):
            self._match_l_paren()
            column = self._parse_column()
            if column is None:
                self._fail("expected a column in DESCRIPTOR(...)")
            self._match_r_paren()
            return _Argument(named, token, column=column.name if column else None)
        value = self._parse_disjunction()
        if not isinstance(value, exp.Interval):
            self._fail("expected TABLE <name>, DESCRIPTOR(<column>) or an INTERVAL in a "
                       "window function", token)
        try:
            return _Argument(named, token, ms=interval_ms(value))
        except SqlError as error:
            self._fail(str(error), token)

    def _window(self, kind: WindowKind, name: Token,
                arguments: list[_Argument]) -> WindowTvf:
        parameters = _PARAMETERS[kind]
        given: dict[str, _Argument] = {}
        for position, argument in enumerate(arguments):
            parameter = argument.name or (parameters[position]
                                          if position < len(parameters) else None)
            if parameter not in parameters or parameter in given:
                self._fail(f"{kind.value} takes ({', '.join(parameters)}): "
                                 f"unexpected argument", argument.token)
            given[cast(str, parameter)] = argument
        missing = [p for p in parameters if p not in given and p != "OFFSET"]
        if missing:
            self._fail(f"{kind.value} needs {', '.join(missing)}", name)
        data, time = given["DATA"], given["TIMECOL"]
        if data.table is None:
            self._fail(f"{kind.value}'s DATA is TABLE <name>", data.token)
        if data.partition_by and kind is not WindowKind.SESSION:
            self._fail(f"{kind.value} takes no PARTITION BY (only SESSION does)",
                             data.token)
        if time.column is None:
            self._fail(f"{kind.value}'s TIMECOL is DESCRIPTOR(<column>)", time.token)
        durations: dict[str, int] = {}
        for parameter, field in _DURATIONS.items():
            if (argument := given.get(parameter)) is None:
                continue
            if argument.ms is None:
                self._fail(f"{kind.value}'s {parameter} is an INTERVAL", argument.token)
            elif argument.ms <= 0 and parameter != "OFFSET":
                self._fail(f"{kind.value}'s {parameter} must be positive",
                                 argument.token)
            durations[field] = cast(int, argument.ms)
        return WindowTvf(kind=kind, table=cast(str, data.table),
                         time_column=cast(str, time.column),
                         partition_by=data.partition_by, **durations)

    def _parse_as_command(self, start: Token) -> exp.Command:
        # sqlglot would keep what it cannot read as opaque text: refuse it instead
        where = self._curr or start
        self._fail(f"unsupported syntax in {start.text.upper()} statement at {where.text!r}",
                   where)

    def _warn_unsupported(self) -> None:
        pass  # (what sqlglot keeps as a Command is a SqlError of parse(); no warning first)

    def _fail(self, message: str, token: Token | None = None) -> NoReturn:
        self.raise_error(message, token)
        raise ParseError(message)  # (raise_error only collects below ErrorLevel.IMMEDIATE)

    def raise_error(self, message: str, token: Token | None = None) -> None:
        # the offset of the token (parse() turns it into line and column), or just past the
        # last one when the statement ended early; "at_end" says which
        # (past the last token, sqlglot's current one is None or a SENTINEL)
        at_end = token is None and self._prev is not None and (
            self._curr is None or self._curr.token_type == TokenType.SENTINEL)
        token = token or (self._prev if at_end else self._curr) or Token.string("")
        place = {"start": token.end + 1 if at_end else token.start, "at_end": at_end}
        count = len(self.errors)
        try:
            super().raise_error(message, token)
        except ParseError as error:
            error.errors[0].update(place)
            raise
        for error in self.errors[count:]:
            error.errors[0].update(place)


def _quoted(name: str) -> str:
    return ".".join(f"`{part}`" for part in name.split("."))


def _duration(ms: int) -> str:
    return f"INTERVAL '{Decimal(ms) / 1000}' SECOND"


def _window_sql(generator: generator.Generator, expression: WindowTableFunction) -> str:
    window = expression.window
    data = f"TABLE {_quoted(window.table)}"
    if window.partition_by:
        data += f" PARTITION BY ({', '.join(map(_quoted, window.partition_by))})"
    arguments = [data, f"DESCRIPTOR({_quoted(window.time_column)})"]
    for parameter in _PARAMETERS[window.kind][2:]:
        ms = getattr(window, _DURATIONS[parameter])
        if parameter != "OFFSET" or ms:
            arguments.append(_duration(ms))
    alias = generator.sql(expression, "alias")
    return (f"TABLE({window.kind.value}({', '.join(arguments)}))"
            + (f" AS {alias}" if alias else ""))


class Flink(Dialect):
    """Flink SQL: backticks quote identifiers, single quotes strings."""

    class Tokenizer(tokens.Tokenizer):
        IDENTIFIERS = ["`"]
        QUOTES = ["'"]
        # sqlglot reads the rest of an EXECUTE or EXPLAIN statement as one string: Flink's
        # EXECUTE STATEMENT SET BEGIN ..., EXECUTE INSERT and EXPLAIN <statement> hold
        # statements that parse() reads
        COMMANDS = tokens.Tokenizer.COMMANDS - {TokenType.EXECUTE}
        KEYWORDS = {**tokens.Tokenizer.KEYWORDS, "EXPLAIN": TokenType.VAR}

    Parser = FlinkParser

    class Generator(generator.Generator):
        TRANSFORMS = {**generator.Generator.TRANSFORMS, WindowTableFunction: _window_sql}
        STRUCT_DELIMITER = ("<", ">")
        TYPE_MAPPING = {**generator.Generator.TYPE_MAPPING, exp.DType.STRUCT: "ROW",
                        exp.DType.TEXT: "STRING", exp.DType.TIMESTAMPLTZ: "TIMESTAMP_LTZ"}
