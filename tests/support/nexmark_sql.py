"""The Nexmark SQL files (tests/sql/nexmark/, as nexmark/nexmark publishes them) ready to
run on raystream, and the generator's events as pandas for the oracles."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from raystream.nexmark import EventKind, NexmarkConfig, generate

QUERIES = Path(__file__).parent.parent / "sql" / "nexmark"
EVENTS = 40_000
RATE = 1_000  # events per second of event time: 40 s, so the 10 s sessions of q11 are many
CONFIG = NexmarkConfig(first_event_rate=RATE)


def nexmark_ddl(batch_size: int | None = None) -> str:
    """ddl_gen.sql and ddl_views.sql with their placeholders filled; ``batch_size``: and
    raystream's option for the span of a source batch added."""
    text = (QUERIES / "ddl_gen.sql").read_text()
    if batch_size is not None:
        text = text.replace("'connector' = 'nexmark',",
                            f"'connector' = 'nexmark', 'batch-size' = '{batch_size}',")
    for key, value in {"TPS": RATE, "EVENTS_NUM": EVENTS, "PERSON_PROPORTION": 1,
                       "AUCTION_PROPORTION": 3, "BID_PROPORTION": 46}.items():
        text = text.replace("${" + key + "}", str(value))
    return text + ";\n" + (QUERIES / "ddl_views.sql").read_text().replace(
        "${NEXMARK_TABLE}", "datagen")


# q13's side input (Nexmark ships a data/side_input.txt of key,value lines): every third
# key of MOD(auction, 10000), so that some bids find no row
SIDE_INPUT = pd.DataFrame({"key": range(0, 10_000, 3)}).assign(value=lambda d: "v" + d["key"].astype(str))


def query(name: str, directory: Path | None = None) -> str:
    """A query file with its sink's connector made ``collect``, the one change (and q14's
    Java function the Python one, ``LANGUAGE PYTHON``, as the issue of SQL allows); q10's
    files go under ``directory`` (its placeholders ``${NEXMARK_DIR}`` and ``${SUBMIT_TIME}``),
    and q13's side input is written there (``${FLINK_HOME}/data/side_input.txt``)."""
    text = (QUERIES / f"{name}.sql").read_text().replace("'blackhole'", "'collect'").replace(
        "'com.github.nexmark.flink.udf.CountChar'",
        "'raystream.nexmark.udfs.count_char' LANGUAGE PYTHON")
    if "${NEXMARK_DIR}" in text or "${FLINK_HOME}" in text:
        if directory is None:
            raise ValueError(f"{name} reads or writes files: give the directory for them")
        text = text.replace("${NEXMARK_DIR}", str(directory)).replace("${SUBMIT_TIME}", "run")
        text = text.replace("${FLINK_HOME}", str(directory))
    if "side_input.txt" in text:
        (directory / "data").mkdir(parents=True, exist_ok=True)
        SIDE_INPUT.to_csv(directory / "data" / "side_input.txt", header=False, index=False)
    return text


def events(kind: EventKind) -> pd.DataFrame:
    """The generated events of ``kind`` (columns as the generator names them)."""
    return generate(kind, 0, EVENTS, CONFIG).to_pandas()


def bids() -> pd.DataFrame:
    return events(EventKind.BID)


def rows(table: pa.Table | pd.DataFrame) -> list[tuple]:
    df = table.to_pandas() if isinstance(table, pa.Table) else table
    return sorted(df.itertuples(index=False, name=None), key=repr)


def ms(values) -> pd.Series:
    return pd.to_datetime(pd.Series(values), unit="ms")
