"""The Nexmark queries, written with raystream's public API as a user would write them.

Each ``qN(env, events, config)`` builds the query on ``env`` over the first
``events`` Nexmark events (:mod:`raystream.nexmark.source`) and returns its
result stream; attach a sink (``.collect()``, ``.discard()``) and execute. Its
docstring quotes the SQL of the ``nexmark/nexmark`` project (Flink) it implements.
:data:`QUERIES` lists them by name.

    >>> import raystream as rs
    >>> from raystream.nexmark import queries
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> sink = queries.q2(env, 50_000).collect()
    >>> env.execute("q2").table(sink).column_names  # doctest: +SKIP
    ['auction', 'price']

"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

import raystream as rs
from raystream.engine.datastream import DataStream
from raystream.engine.environment import StreamEnvironment
from raystream.nexmark.generator import NexmarkConfig
from raystream.nexmark.source import auctions, bids, persons

EURO_PER_DOLLAR = 0.908
BATCH = 65_536  # event numbers per source batch


def q0(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH) -> DataStream:
    """Pass-through: every bid.

    ``SELECT auction, bidder, price, dateTime, extra FROM bid;``
    """
    return bids(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.select(["auction", "bidder", "price", "date_time", "extra"]), name="q0")


def q1(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH) -> DataStream:
    """Currency conversion: bid prices in euro.

    ``SELECT auction, bidder, 0.908 * price as price, dateTime, extra FROM bid;``
    (``price`` as float64 here, ``DECIMAL(23, 3)`` in Flink.)
    """
    def to_euro(b: pa.RecordBatch) -> pa.RecordBatch:
        euro = pc.multiply(b["price"].cast(pa.float64()), EURO_PER_DOLLAR)  # pyright: ignore[reportAttributeAccessIssue]
        return pa.record_batch([b["auction"], b["bidder"], euro, b["date_time"], b["extra"]],
                               names=["auction", "bidder", "price", "date_time", "extra"])

    return bids(env, events, config, batch_size=batch_size).map_batches(to_euro, name="q1")


def q2(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       modulus: int = 123, batch_size: int = BATCH) -> DataStream:
    """Selection: bids on every 123rd auction.

    ``SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;``
    """
    return bids(env, events, config, batch_size=batch_size).filter_batches(
        lambda b: pa.array(b["auction"].to_numpy() % modulus == 0), name="q2-filter").map_batches(
        lambda b: b.select(["auction", "price"]), name="q2")


Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
Q3_SCHEMA = pa.schema([("name", pa.string()), ("city", pa.string()), ("state", pa.string()),
                       ("id", pa.int64())])


class LocalItemSuggestion(rs.KeyedCoProcessFunction):
    """q3's incremental inner join, keyed by seller = person id: a person is kept once
    seen; auctions of a seller not seen yet wait for them (as a regular SQL join keeps
    both sides)."""

    def open(self, ctx):
        self.person = ctx.value_state("person")
        self.waiting = ctx.list_state("auction_ids")

    def process_element1(self, auction, ctx):  # an auction of category 10
        person = self.person.value()
        if person is None:
            self.waiting.add(auction["id"])
            return None
        return [{**person, "id": auction["id"]}]

    def process_element2(self, person, ctx):  # a person of OR, ID or CA
        seen = {"name": person["name"], "city": person["city"], "state": person["state"]}
        self.person.update(seen)
        waiting = self.waiting.get()
        self.waiting.clear()
        return [{**seen, "id": auction_id} for auction_id in waiting]


def q3(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH) -> DataStream:
    """Local item suggestion: who sells in category 10 in Oregon, Idaho or California.

    ``SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P on
    A.seller = P.id WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR
    P.state = 'CA');``

    Each side is filtered and cut to the columns the join reads before the shuffle (the
    projection Flink's planner pushes down).
    """
    states = pa.array(Q3_STATES)
    local = persons(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.filter(pc.is_in(b["state"], value_set=states)).select(  # pyright: ignore[reportAttributeAccessIssue]
            ["id", "name", "city", "state"]), name="q3-persons")
    category = auctions(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.filter(pc.equal(b["category"], Q3_CATEGORY)).select(  # pyright: ignore[reportAttributeAccessIssue]
            ["id", "seller"]), name="q3-auctions")
    return category.key_by("seller").connect(local.key_by("id")).process(
        LocalItemSuggestion(), name="q3", schema=Q3_SCHEMA)


Q4_SCHEMA = pa.schema([("category", pa.int64()), ("average", pa.float64()),
                       ("auctions", pa.int64()), ("total", pa.int64())])


def _running_average(acc: dict, row: dict) -> dict:
    auctions_, total = acc["auctions"] + row["auctions"], acc["total"] + row["total"]
    return {"category": row["category"], "average": total / auctions_, "auctions": auctions_,
            "total": total}


def _highest_in_time(pairs: pa.RecordBatch) -> pa.Table:
    """The highest price per auction among a batch's joined pairs whose bid came by the
    auction's expiry, with the auction's category and expiry."""
    in_time = pairs.filter(pc.less_equal(pairs["date_time_right"], pairs["expires"]))  # pyright: ignore[reportAttributeAccessIssue]
    highest = pa.Table.from_batches([in_time]).group_by(
        ["id", "category", "expires"], use_threads=False).aggregate([("price", "max")])
    return highest.rename_columns(
        ["price" if n == "price_max" else n for n in highest.column_names])


def q4(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH) -> DataStream:
    """Average closing price per category: the running average of the winning bids of the
    auctions closed so far, one update per closed auction.

    ``SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND
    A.expires GROUP BY A.id, A.category) Q GROUP BY Q.category;``

    As Flink plans it: a join of auctions and bids, then the maximum per auction, then the
    average per category. The join is an interval join (a bid from an auction's start up
    to the longest auction length after it, then up to its own expiry); every joined row
    carries its auction's expiry as event time, so a session window per auction (of the
    shortest gap) closes exactly when the auction does and gives its winning bid. Each
    batch of pairs is cut to its highest bid per auction first (the local phase of
    Flink's two-phase aggregation), so the window sees a row per auction and batch.
    """
    config = config or NexmarkConfig()
    open_auctions = auctions(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.select(["id", "category", "date_time", "expires"]), name="q4-auctions")
    offers = bids(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.select(["auction", "price", "date_time"]), name="q4-bids")
    pairs = open_auctions.key_by("id").interval_join(
        offers.key_by("auction"), timestamp="date_time").between(
        0, config.max_auction_length_ms).join(name="q4-join")
    in_time = pairs.map_batches(_highest_in_time, name="q4-in-time")
    closed = in_time.key_by(["id", "category"]).window(
        rs.EventTimeSessionWindows(gap_ms=1), timestamp="expires").max(
        "price", output="final", name="q4-winning-bids")
    one = closed.map_batches(lambda b: {
        "category": b["category"], "average": b["final"].cast(pa.float64()),
        "auctions": pa.array(np.ones(b.num_rows, dtype=np.int64)), "total": b["final"]},
        name="q4-prepare")
    return one.key_by("category").reduce(_running_average, name="q4", schema=Q4_SCHEMA)


HOT_SCHEMA = pa.schema([("auction", pa.int64()), ("num", pa.int64()),
                        ("starttime", pa.int64()), ("endtime", pa.int64())])


class AllAtMax(rs.ProcessWindowFunction):
    """The rows of a window whose ``column`` equals the window's maximum (every tie),
    with ``columns`` renamed as ``rename`` says; vectorized over the window's rows."""

    def __init__(self, column: str, columns: dict[str, str]) -> None:
        self.column, self.columns = column, columns

    def process(self, key, window, rows):
        best = rows.filter(pc.equal(rows[self.column], pc.max(rows[self.column])))  # pyright: ignore[reportAttributeAccessIssue]
        return best.select(list(self.columns)).rename_columns(
            list(self.columns.values())).to_pylist()


def q5(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH, size_ms: int = 10_000, slide_ms: int = 2_000) -> DataStream:
    """Hot items: per sliding window (10 s every 2 s), the auctions with the most bids.

    ``SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, count(*) AS num,
    window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid,
    DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction,
    window_start, window_end) AS AuctionBids JOIN (SELECT max(CountBids.num) AS maxn,
    CountBids.starttime, CountBids.endtime FROM (...the same counts...) AS CountBids
    GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime
    = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >=
    MaxBids.maxn;``

    The counts per (auction, window) are vectorized and pre-aggregated; their results
    carry event time ``window_end - 1``, so a tumbling ``window_all`` of ``slide_ms``
    holds exactly the counts of one sliding window.
    """
    counts = bids(env, events, config, batch_size=batch_size).key_by("auction").window(
        rs.SlidingEventTimeWindows(size_ms=size_ms, slide_ms=slide_ms),
        timestamp="date_time").count(output="num", name="q5-counts")
    return counts.window_all(rs.TumblingEventTimeWindows(size_ms=slide_ms)).process(
        AllAtMax("num", {"auction": "auction", "num": "num", "window_start": "starttime",
                         "window_end": "endtime"}), name="q5", schema=HOT_SCHEMA)


HIGHEST_SCHEMA = pa.schema([("auction", pa.int64()), ("price", pa.int64()),
                            ("bidder", pa.int64()), ("date_time", pa.int64()),
                            ("extra", pa.string())])


def _window_maxima(size_ms: int) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """Per batch, the bids at their tumbling window's highest price within the batch: a
    window's highest bids overall are among them, so the window sees few rows (and only
    the columns of the result: not the dictionaries of ``channel`` and ``url``, which a
    filtered batch would still carry whole)."""
    def keep(batch: pa.RecordBatch) -> pa.RecordBatch:
        window = batch["date_time"].to_numpy() // size_ms
        price = batch["price"].to_numpy()
        windows, inverse = np.unique(window, return_inverse=True)
        best = np.full(len(windows), np.iinfo(np.int64).min)
        np.maximum.at(best, inverse, price)
        return batch.filter(pa.array(price == best[inverse])).select(HIGHEST_SCHEMA.names)
    return keep


def q7(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH, size_ms: int = 10_000) -> DataStream:
    """Highest bid: the bids at the highest price of their tumbling 10 s window.

    ``SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra from bid B JOIN (SELECT
    MAX(price) AS maxprice, window_end as dateTime FROM TABLE(TUMBLE(TABLE bid,
    DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY window_start, window_end) B1 ON
    B.price = B1.maxprice WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND
    AND B1.dateTime;``

    (A bid at exactly ``window_end`` belongs to the next window here: windows are
    ``[start, end)``.)
    """
    candidates = bids(env, events, config, batch_size=batch_size).map_batches(_window_maxima(size_ms),
                                                       name="q7-batch-maxima")
    return candidates.window_all(rs.TumblingEventTimeWindows(size_ms=size_ms),
                                 timestamp="date_time").process(
        AllAtMax("price", {c: c for c in HIGHEST_SCHEMA.names}), name="q7",
        schema=HIGHEST_SCHEMA)


def q11(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
        batch_size: int = BATCH, gap_ms: int = 10_000) -> DataStream:
    """User sessions: bids per bidder and session (a 10 s gap ends one).

    ``SELECT B.bidder, count(*) as bid_count, SESSION_START(B.dateTime, INTERVAL '10'
    SECOND) as starttime, SESSION_END(B.dateTime, INTERVAL '10' SECOND) as endtime FROM
    bid B GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND);``
    """
    return bids(env, events, config, batch_size=batch_size).key_by("bidder").window(
        rs.EventTimeSessionWindows(gap_ms=gap_ms), timestamp="date_time").count(
        output="bid_count", name="q11")


def q8(env: StreamEnvironment, events: int, config: NexmarkConfig | None = None, *,
       batch_size: int = BATCH, size_ms: int = 10_000) -> DataStream:
    """New users: people who registered and opened an auction in the same 10 s window
    (a window join of persons with their auctions, counted per seller and window first).

    ``SELECT P.id, P.name, P.starttime FROM (SELECT id, name, TUMBLE_START(dateTime,
    INTERVAL '10' SECOND) AS starttime, TUMBLE_END(dateTime, INTERVAL '10' SECOND) AS
    endtime FROM person GROUP BY id, name, TUMBLE(dateTime, INTERVAL '10' SECOND)) P JOIN
    (SELECT seller, TUMBLE_START(dateTime, INTERVAL '10' SECOND) AS starttime,
    TUMBLE_END(dateTime, INTERVAL '10' SECOND) AS endtime FROM auction GROUP BY seller,
    TUMBLE(dateTime, INTERVAL '10' SECOND)) A ON P.id = A.seller AND P.starttime =
    A.starttime AND P.endtime = A.endtime;``
    """
    windows = rs.TumblingEventTimeWindows(size_ms=size_ms)
    people = persons(env, events, config, batch_size=batch_size).map_batches(
        lambda b: b.select(["id", "name", "date_time"]), name="q8-persons")
    sellers = auctions(env, events, config, batch_size=batch_size).key_by("seller").window(
        windows, timestamp="date_time").count(name="q8-sellers")  # one row per seller, window
    # persons by their own time, sellers' rows by their window's (window_end - 1)
    joined = people.join(sellers).where("id").equal_to("seller").window(
        windows, left_timestamp="date_time").join(name="q8-join")
    return joined.map_batches(
        lambda b: pa.record_batch([b["id"], b["name"], b["window_start"]],
                                  names=["id", "name", "starttime"]), name="q8")


QUERIES: dict[str, Callable[..., DataStream]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8, "q11": q11}
"""Every query implemented, by name."""
