"""raystream's SQL: Flink SQL statements parsed into typed statements
(:mod:`~raystream.engine.sql.ast`) that the planner reads. Nothing of the runtime imports
this package."""

from raystream.engine.sql.ast import (ArrayType, Column, ComputedColumn, CreateFunction,
                                      CreateTable, CreateView, Explain, FunctionLanguage,
                                      Insert, MapType, PhysicalColumn, Query, RowField, RowType,
                                      ScalarType, SqlType, Statement, StatementSet, TypeName,
                                      Watermark, WindowKind, WindowTvf)
from raystream.engine.sql.dialect import Flink, WindowTableFunction
from raystream.engine.sql.intervals import interval_ms
from raystream.engine.sql.parser import parse

__all__ = ["ArrayType", "Column", "ComputedColumn", "CreateFunction", "CreateTable",
           "CreateView", "Explain", "Flink", "FunctionLanguage", "Insert", "MapType",
           "PhysicalColumn", "Query", "RowField", "RowType", "ScalarType", "SqlType",
           "Statement", "StatementSet", "TypeName", "Watermark", "WindowKind",
           "WindowTableFunction", "WindowTvf", "interval_ms", "parse"]
