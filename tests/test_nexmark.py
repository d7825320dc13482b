"""Nexmark: the generator against the reference's rules, and every query against a pandas
oracle over the same generated events (real Ray jobs; failures injected in q3 and q5)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream import nexmark
from raystream.nexmark import EventKind, NexmarkConfig, generate, queries

EVENTS = 40_000
# 1,000 events per second of event time: 40 s, so the 10 s windows of q5, q7, q11 are many
CONFIG = NexmarkConfig(seed=11, first_event_rate=1_000)
BATCH = 2_048  # small source batches: many checkpoints and failure points in a small job


def frame(kind: EventKind, events: int = EVENTS, config: NexmarkConfig = CONFIG) -> pd.DataFrame:
    return generate(kind, 0, events, config).to_pandas()


def rows(table: pa.Table | pd.DataFrame, columns: list[str]) -> list[tuple]:
    df = table.to_pandas() if isinstance(table, pa.Table) else table
    return sorted(df[columns].itertuples(index=False, name=None))


def checkpointed(tmp_path, parallelism: int = 2, failpoints=()) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(
        parallelism=parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk")),
        failpoints=list(failpoints), restart=rs.RestartStrategy.fixed_delay(3, 0.1))


# -- the generator ----------------------------------------------------------------------------

def test_generator_follows_the_reference_proportions_ids_and_times():
    n = 100_000
    config = NexmarkConfig(seed=5)
    people, auctions, bids = (frame(k, n, config) for k in EventKind)
    assert (len(people), len(auctions), len(bids)) == (n // 50, 3 * n // 50, 46 * n // 50)
    # ids count up from 1000 in event order; event time from the rate (10 events per ms)
    assert (people["id"].to_numpy() == 1000 + np.arange(len(people))).all()
    assert (auctions["id"].to_numpy() == 1000 + np.arange(len(auctions))).all()
    event = np.arange(n)
    kind = event % 50
    assert (bids["date_time"].to_numpy() == config.base_time_ms + event[kind >= 4] // 10).all()
    assert (people["date_time"].to_numpy() == config.base_time_ms + event[kind == 0] // 10).all()
    # hot auctions: with hot_auction_ratio 2, about half the bids go to the auction at the
    # start of the current batch of 100 auctions, the others to a recent one (or a few ahead)
    last_auction = event[kind >= 4] // 50 * 3 + 2
    hot = bids["auction"].to_numpy() - 1000 == last_auction // 100 * 100
    assert 0.45 < hot.mean() < 0.6
    recent = bids["auction"].to_numpy() - 1000
    assert ((recent >= np.maximum(last_auction - 100, 0)) & (recent <= last_auction + 10)
            | hot).all()
    # hot bidders: 3 in 4 bids by the 2nd person of the current batch of 100 (+1000 twice,
    # as the reference's BidGenerator adds FIRST_PERSON_ID twice)
    last_person = event[kind >= 4] // 50
    hot_bidder = bids["bidder"].to_numpy() - 2000 == last_person // 100 * 100 + 1
    assert 0.7 < hot_bidder.mean() < 0.8
    hot_seller = auctions["seller"].to_numpy() - 1000 == (event[(kind >= 1) & (kind < 4)]
                                                          // 50) // 100 * 100
    assert 0.7 < hot_seller.mean() < 0.8
    assert set(auctions["category"]) == {10, 11, 12, 13, 14}
    length = auctions["expires"] - auctions["date_time"]
    assert (length > 0).all() and (length <= config.max_auction_length_ms).all()
    assert length.max() > 0.9 * config.max_auction_length_ms  # the bound is tight
    assert (auctions["reserve"] > auctions["initial_bid"]).all()
    prices = bids["price"].to_numpy()
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    assert 80 < (bids["extra"].str.len() + 32).mean() < 120  # avg_bid_byte_size 100
    assert set(people["state"]) <= {"AZ", "CA", "ID", "OR", "WA", "WY"}
    assert people["credit_card"].str.fullmatch(r"\d{4} \d{4} \d{4} \d{4}").all()


def test_generator_is_a_pure_function_of_seed_and_event_number():
    config = NexmarkConfig(seed=2)
    whole = generate(EventKind.BID, 0, 10_000, config)
    pieces = pa.Table.from_batches([generate(EventKind.BID, lo, lo + 1_000, config)
                                    for lo in range(9_000, -1, -1_000)])
    assert pieces.sort_by("date_time").equals(pa.Table.from_batches([whole]).sort_by("date_time"))
    assert generate(EventKind.BID, 0, 10_000, config).equals(whole)
    other = generate(EventKind.BID, 0, 10_000, NexmarkConfig(seed=3))
    assert not other.column("price").equals(whole.column("price"))


def test_source_splits_cover_every_event_once_and_share_each_kind_evenly():
    """The splits of each kind's source are, together, exactly the generated events, and
    each holds its kind's share within one block of 50 events: a reader of a kind never
    carries much more than another (unequal ones made the lighter auction reader of q4
    fall behind in event time at p=2, which held back the join's watermark)."""
    for events, num_splits in [(40_000, 4), (40_037, 4), (10_010, 3), (777, 2)]:
        for kind in EventKind:
            source = nexmark.NexmarkSource(kind, events, CONFIG, num_splits=num_splits,
                                           batch_size=1_000)
            parts = []
            for split in source.splits():
                reader = source.reader(split)
                batches = iter(reader.next_batch, None)
                parts.append(pa.Table.from_batches(list(batches), schema=nexmark.SCHEMAS[kind]))
            whole = frame(kind, events)
            got = pa.concat_tables(parts).to_pandas()
            assert rows(got, ["date_time", "extra"]) == rows(whole, ["date_time", "extra"])
            share = len(whole) / num_splits
            per_block = len(frame(kind, 50))
            assert all(abs(p.num_rows - share) <= per_block for p in parts), (events, kind)


def test_bad_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="proportion"):
        NexmarkConfig(bid_proportion=0)
    with pytest.raises(ValueError, match="events >= 0"):
        nexmark.NexmarkSource(EventKind.BID, -1)


# -- the queries ------------------------------------------------------------------------------

@pytest.mark.slow
def test_stateless_queries_q0_q1_q2_equal_pandas(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    sinks = {name: getattr(queries, name)(env, EVENTS, CONFIG, batch_size=BATCH).collect(name=name)
             for name in ("q0", "q1", "q2")}
    result = env.execute("nexmark-stateless")
    bids = frame(EventKind.BID)
    cols = ["auction", "bidder", "price", "date_time", "extra"]
    assert rows(result.table(sinks["q0"]), cols) == rows(bids, cols)
    euro = bids.assign(price=bids["price"] * 0.908)
    assert rows(result.table(sinks["q1"]), cols) == rows(euro, cols)
    selected = bids[bids["auction"] % 123 == 0]
    assert len(selected) > 50
    assert rows(result.table(sinks["q2"]), ["auction", "price"]) == rows(selected,
                                                                         ["auction", "price"])


def q3_oracle() -> list[tuple]:
    people = frame(EventKind.PERSON)
    auctions = frame(EventKind.AUCTION)
    joined = auctions[auctions["category"] == 10].merge(
        people[people["state"].isin(["OR", "ID", "CA"])], left_on="seller", right_on="id",
        suffixes=("", "_person"))
    return rows(joined, ["name", "city", "state", "id"])


@pytest.mark.slow
def test_q3_incremental_join_is_exactly_once_through_a_subtask_crash(ray_session, tmp_path):
    env = checkpointed(tmp_path, failpoints=[
        rs.Failpoint("in_processing", operator="q3", subtask=1, hit=12, action="exit")])
    sink = queries.q3(env, EVENTS, CONFIG, batch_size=BATCH).collect()
    result = env.execute("nexmark-q3")
    assert result.restarts == 1, result.failures
    expected = q3_oracle()
    assert len(expected) > 100
    assert rows(result.table(sink), ["name", "city", "state", "id"]) == expected


def winning_bids() -> pd.DataFrame:
    auctions = frame(EventKind.AUCTION)
    bids = frame(EventKind.BID)
    pairs = auctions.merge(bids, left_on="id", right_on="auction", suffixes=("", "_bid"))
    valid = pairs[(pairs["date_time_bid"] >= pairs["date_time"])
                  & (pairs["date_time_bid"] <= pairs["expires"])]
    return valid.groupby(["id", "category"], as_index=False)["price"].max()


@pytest.mark.slow
def test_q4_average_closing_price_per_category_through_a_subtask_crash(ray_session, tmp_path):
    env = checkpointed(tmp_path, failpoints=[
        rs.Failpoint("in_processing", operator="q4-winning-bids", subtask=1, hit=8, action="exit")])
    sink = queries.q4(env, EVENTS, CONFIG, batch_size=BATCH).collect()
    result = env.execute("nexmark-q4")
    assert result.restarts == 1, result.failures
    got = result.table(sink).to_pandas()
    finals = winning_bids()
    assert len(finals) > 500
    for category, group in finals.groupby("category"):
        updates = got[got["category"] == category]
        # one update per closed auction, each once: the counts are 1..n
        assert sorted(updates["auctions"]) == list(range(1, len(group) + 1))
        last = updates[updates["auctions"] == len(group)].iloc[0]
        assert last["total"] == group["price"].sum()
        assert last["average"] == pytest.approx(group["price"].mean())
    assert set(got["category"]) == set(finals["category"])


def q5_oracle(size_ms: int, slide_ms: int) -> list[tuple]:
    bids = frame(EventKind.BID)
    first = bids["date_time"] // slide_ms * slide_ms
    windows = pd.concat([bids.assign(starttime=first - k * slide_ms)
                         for k in range(size_ms // slide_ms)])
    counts = windows.groupby(["auction", "starttime"], as_index=False).size()
    counts = counts.rename(columns={"size": "num"})
    best = counts.groupby("starttime")["num"].transform("max")
    hot = counts[counts["num"] == best].assign(endtime=lambda d: d["starttime"] + size_ms)
    return rows(hot, ["auction", "num", "starttime", "endtime"])


@pytest.mark.slow
def test_q5_hot_items_are_exactly_once_through_a_subtask_crash(ray_session, tmp_path):
    env = checkpointed(tmp_path, failpoints=[
        rs.Failpoint("in_processing", operator="q5-counts", subtask=0, hit=3, action="exit")])
    sink = queries.q5(env, EVENTS, CONFIG, batch_size=BATCH).collect()
    result = env.execute("nexmark-q5")
    assert result.restarts == 1, result.failures
    expected = q5_oracle(10_000, 2_000)
    assert len(expected) >= 20
    assert rows(result.table(sink), ["auction", "num", "starttime", "endtime"]) == expected


@pytest.mark.slow
def test_q7_highest_bid_per_window(ray_session, tmp_path):
    env = checkpointed(tmp_path)
    sink = queries.q7(env, EVENTS, CONFIG, batch_size=BATCH, size_ms=2_000).collect()
    got = env.execute("nexmark-q7").table(sink)
    bids = frame(EventKind.BID)
    window = bids["date_time"] // 2_000
    expected = bids[bids["price"] == bids.groupby(window)["price"].transform("max")]
    cols = ["auction", "price", "bidder", "date_time", "extra"]
    assert len(expected) >= 20
    assert rows(got, cols) == rows(expected, cols)


@pytest.mark.slow
def test_q11_user_sessions(ray_session, tmp_path):
    gap = 2_000
    env = checkpointed(tmp_path)
    sink = queries.q11(env, EVENTS, CONFIG, batch_size=BATCH, gap_ms=gap).collect()
    got = env.execute("nexmark-q11").table(sink)
    bids = frame(EventKind.BID).sort_values(["bidder", "date_time"], kind="stable")
    new = (bids["bidder"] != bids["bidder"].shift()) | (bids["date_time"].diff() >= gap)
    sessions = bids.assign(session=new.cumsum()).groupby(["bidder", "session"]).agg(
        window_start=("date_time", "min"), last=("date_time", "max"),
        bid_count=("date_time", "size")).reset_index()
    sessions["window_end"] = sessions["last"] + gap
    cols = ["bidder", "window_start", "window_end", "bid_count"]
    assert len(sessions) > 500 and sessions["bid_count"].max() > 100
    assert rows(got, cols) == rows(sessions, cols)


@pytest.mark.slow
def test_q8_new_users_window_join_is_exactly_once_through_a_subtask_crash(ray_session, tmp_path):
    size = 2_000
    env = checkpointed(tmp_path, failpoints=[
        rs.Failpoint("in_processing", operator="q8-join", subtask=1, hit=2, action="exit")])
    sink = queries.q8(env, EVENTS, CONFIG, batch_size=BATCH, size_ms=size).collect()
    result = env.execute("nexmark-q8")
    assert result.restarts == 1, result.failures
    people, auctions = frame(EventKind.PERSON), frame(EventKind.AUCTION)
    people["starttime"] = people["date_time"] // size * size
    auctions["starttime"] = auctions["date_time"] // size * size
    sellers = auctions[["seller", "starttime"]].drop_duplicates()
    expected = people.merge(sellers, left_on=["id", "starttime"],
                            right_on=["seller", "starttime"])
    cols = ["id", "name", "starttime"]
    assert len(expected) >= 20
    assert rows(result.table(sink), cols) == rows(expected, cols)
