"""The Nexmark event generator, vectorized: any range of events as Arrow batches.

Follows the reference generator of the ``nexmark/nexmark`` project
(``GeneratorConfig``, ``NexmarkGenerator``, ``PersonGenerator``,
``AuctionGenerator``, ``BidGenerator``, ``PriceGenerator``,
``StringsGenerator``): event ``n`` is a person, an auction or a bid by
``n mod 50`` (proportions 1 : 3 : 46), its event time is
``base_time_ms + floor(n * inter_event_delay_us) / 1000`` with the delay from
the configured rate, and ids, sellers, bidders, auctions, categories, prices,
auction lengths and the hot auction / seller / bidder choices are computed as
the reference computes them. Where the reference draws from one sequential
``SplittableRandom``, each draw here is a hash of ``(seed, event number,
draw)``, so event ``n`` is a pure function of ``(seed, n)``: any range can be
generated alone, in any order, at any parallelism, and replays are identical.

    >>> config = NexmarkConfig(seed=7)
    >>> bids = generate(EventKind.BID, 0, 100, config)
    >>> bids.num_rows, bids.schema.names[:4]
    (92, ['auction', 'bidder', 'price', 'channel'])
    >>> generate(EventKind.PERSON, 0, 100, config)["id"].to_pylist()
    [1000, 1001]
    >>> generate(EventKind.AUCTION, 0, 50, config)["id"].to_pylist()
    [1000, 1001, 1002]
    >>> generate(EventKind.BID, 0, 100, config).equals(bids)  # deterministic per seed
    True

Differences from the reference, on purpose: times are int64 milliseconds (the
reference's ``TIMESTAMP(3)``); ``extra`` strings are slices of one random
1 MiB string per seed, as the reference's ``nextExactString`` does for short
lengths; the reference's bid channel/URL cache is drawn per seed and a bid's ``channel``
and ``url`` are dictionary-encoded over it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

# The reference's constants (GeneratorConfig, PersonGenerator, AuctionGenerator, BidGenerator)
FIRST_AUCTION_ID = 1000
FIRST_PERSON_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_BATCH = 100  # HOT_AUCTION_RATIO / HOT_SELLER_RATIO / HOT_BIDDER_RATIO: hot-id granularity
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
MIN_STRING_LENGTH = 3
EXTRA_POOL_BYTES = 1024 * 1024


class EventKind(enum.Enum):
    """The three Nexmark streams."""

    PERSON = "person"
    AUCTION = "auction"
    BID = "bid"


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's settings; the defaults are the reference's (``NexmarkConfiguration``).

    ``first_event_rate`` events per second (over all generators) sets event-time
    spacing: ``inter_event_delay_us = 1e6 / first_event_rate * num_event_generators``.
    ``hot_*_ratio``: a bid is for a hot auction with probability ``1 - 1/hot_auction_ratio``
    (likewise hot bidders and sellers). ``base_time_ms``: event time of event 0.

        >>> NexmarkConfig().inter_event_delay_us
        100.0
    """

    seed: int = 0
    first_event_rate: int = 10_000
    num_event_generators: int = 1
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    base_time_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        if min(self.person_proportion, self.auction_proportion, self.bid_proportion) < 1:
            raise ValueError("NexmarkConfig: every proportion must be >= 1")
        if self.first_event_rate <= 0 or self.num_event_generators <= 0:
            raise ValueError("NexmarkConfig: first_event_rate and num_event_generators must be > 0")
        if min(self.hot_auction_ratio, self.hot_sellers_ratio, self.hot_bidders_ratio) < 1:
            raise ValueError("NexmarkConfig: hot ratios must be >= 1")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1_000_000.0 / self.first_event_rate * self.num_event_generators

    @property
    def max_auction_length_ms(self) -> int:
        """The longest ``expires - date_time`` an auction can have (``nextAuctionLengthMs``:
        up to twice the time until ``num_in_flight_auctions`` more auctions exist)."""
        ahead = self.num_in_flight_auctions * self.total_proportion // self.auction_proportion
        return 2 * (int(ahead * self.inter_event_delay_us) // 1000 + 2)

    def timestamp_for_event(self, n: np.ndarray) -> np.ndarray:
        """Event time (ms) of event numbers ``n`` (``GeneratorConfig.timestampForEvent``)."""
        return self.base_time_ms + (n * self.inter_event_delay_us).astype(np.int64) // 1000

    def kind_of(self, n: np.ndarray) -> np.ndarray:
        """0 (person), 1 (auction) or 2 (bid) per event number."""
        rem = n % self.total_proportion
        return (rem >= self.person_proportion).astype(np.int8) + (
            rem >= self.person_proportion + self.auction_proportion)

    def event_numbers(self, kind: EventKind, lo: int, hi: int) -> np.ndarray:
        """The event numbers in ``[lo, hi)`` that are events of ``kind``, ascending."""
        first, count = {EventKind.PERSON: (0, self.person_proportion),
                        EventKind.AUCTION: (self.person_proportion, self.auction_proportion),
                        EventKind.BID: (self.person_proportion + self.auction_proportion,
                                        self.bid_proportion)}[kind]
        total = self.total_proportion
        epochs = np.arange(lo // total, -(-hi // total), dtype=np.int64)
        n = (epochs[:, None] * total + np.arange(first, first + count)).ravel()
        return n[(n >= lo) & (n < hi)]


_KIND_CODE = {EventKind.PERSON: 0, EventKind.AUCTION: 1, EventKind.BID: 2}

_DICTIONARY = pa.dictionary(pa.int32(), pa.string())
SCHEMAS = {
    EventKind.PERSON: pa.schema([
        ("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
        ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
        ("date_time", pa.int64()), ("extra", pa.string())]),
    EventKind.AUCTION: pa.schema([
        ("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
        ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", pa.int64()),
        ("expires", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
        ("extra", pa.string())]),
    EventKind.BID: pa.schema([
        ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
        # dictionary-encoded: 10,004 channels and URLs (the reference's channel cache)
        ("channel", _DICTIONARY), ("url", _DICTIONARY), ("date_time", pa.int64()),
        ("extra", pa.string())]),
}


def generate(kind: EventKind, lo: int, hi: int, config: NexmarkConfig) -> pa.RecordBatch:
    """The events of ``kind`` among event numbers ``[lo, hi)``, in event order."""
    return _GENERATORS[kind](config.event_numbers(kind, lo, hi), config)


def generate_numbers(kind: EventKind, n: np.ndarray, config: NexmarkConfig) -> pa.RecordBatch:
    """The events of ``kind`` among the (ascending, int64) event numbers ``n``."""
    return _GENERATORS[kind](n[config.kind_of(n) == _KIND_CODE[kind]], config)


# -- counter-based randomness: draw d of event n is a hash of (seed, n, d) --------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (a bijection of uint64 with good avalanche)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _bits(seed: int, counter: np.ndarray, draw: int) -> np.ndarray:
    key = np.uint64((seed * 0x2545F4914F6CDD1D + draw * 0x9E3779B1) % (1 << 64))
    with np.errstate(over="ignore"):
        return _mix(counter.astype(np.uint64) * _GOLDEN + key)


def _unit(seed: int, counter: np.ndarray, draw: int) -> np.ndarray:
    """Uniform doubles in [0, 1) (``SplittableRandom.nextDouble``)."""
    return (_bits(seed, counter, draw) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _fields(seed: int, counter: np.ndarray, draw: int, *bounds) -> list[np.ndarray]:
    """Up to three uniform ints in ``[0, bound)`` from one hash, 21 bits each (for
    bounds far below 2**21, as the per-bid choices are): fewer hashes per event."""
    bits = _bits(seed, counter, draw)
    mask = np.uint64((1 << 21) - 1)
    return [(((bits >> np.uint64(21 * i)) & mask) * np.asarray(bound, dtype=np.uint64)
             >> np.uint64(21)).astype(np.int64) for i, bound in enumerate(bounds)]


def _below(seed: int, counter: np.ndarray, draw: int, bound) -> np.ndarray:
    """Uniform ints in ``[0, bound)`` (``nextInt(bound)``; ``bound`` scalar or array)."""
    return (_unit(seed, counter, draw) * bound).astype(np.int64)


# draw numbers: one per random choice of an event (as the reference's sequential draws)
(_D_HOT, _D_ID, _D_PRICE, _D_PRICE2, _D_CATEGORY, _D_LENGTH, _D_EXTRA_LEN, _D_FIRST, _D_LAST,
 _D_CITY, _D_STATE, _D_CARD, _D_STR1, _D_STR2) = range(14)


# -- ids, as the reference computes them ---------------------------------------------------------

def last_base0_person_id(c: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    epoch, offset = n // c.total_proportion, n % c.total_proportion
    return epoch * c.person_proportion + np.minimum(offset, c.person_proportion - 1)


def last_base0_auction_id(c: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    epoch, offset = n // c.total_proportion, n % c.total_proportion
    is_person = offset < c.person_proportion
    is_bid = offset >= c.person_proportion + c.auction_proportion
    epoch = np.where(is_person, epoch - 1, epoch)
    offset = np.where(is_person | is_bid, c.auction_proportion - 1, offset - c.person_proportion)
    return epoch * c.auction_proportion + offset


def _next_base0_person_id(c: NexmarkConfig, n: np.ndarray, draw: int) -> np.ndarray:
    num_people = last_base0_person_id(c, n) + 1
    active = np.minimum(num_people, c.num_active_people)
    return num_people - active + _below(c.seed, n, draw, active + PERSON_ID_LEAD)


def _next_price(c: NexmarkConfig, n: np.ndarray, draw: int) -> np.ndarray:
    return np.round(10.0 ** (_unit(c.seed, n, draw) * 6.0) * 100.0).astype(np.int64)


# -- strings -------------------------------------------------------------------------------------

def _string_array(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets),
                                       pa.py_buffer(np.ascontiguousarray(data, dtype=np.uint8)))


def _ragged(matrix: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Strings from the first ``lengths[i]`` bytes of row ``i`` of ``matrix`` (uint8)."""
    keep = np.arange(matrix.shape[1]) < lengths[:, None]
    return _string_array(lengths, matrix[keep])


TABLE_SIZE = 1 << 16  # distinct strings per string table (names, descriptions, emails)
EXTRA_VARIANTS = 32   # distinct extras per length


@lru_cache(maxsize=32)
def _string_table(seed: int, max_length: int, special: str = " ") -> pa.Array:
    """``TABLE_SIZE`` strings drawn as ``StringsGenerator.nextString`` draws them: 3 to
    ``max_length - 1`` characters, each a lowercase letter or (1 in 13) ``special``,
    trimmed. Events pick one by a hash, so a string costs a ``take``, not a draw per
    character."""
    rng = np.random.default_rng([seed, max_length, ord(special)])
    lengths = rng.integers(MIN_STRING_LENGTH, max_length, TABLE_SIZE)
    chars = rng.integers(ord("a"), ord("z") + 1, (TABLE_SIZE, max_length - 1), dtype=np.uint8)
    chars[rng.integers(0, 13, chars.shape) == 0] = ord(special)
    return pc.utf8_trim(_ragged(chars, lengths), characters=" ")  # pyright: ignore[reportAttributeAccessIssue]


def _next_string(c: NexmarkConfig, n: np.ndarray, draw: int, max_length: int) -> pa.Array:
    return _string_table(c.seed, max_length).take(pa.array(_below(c.seed, n, draw, TABLE_SIZE)))


@lru_cache(maxsize=8)
def _pools(seed: int) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Per seed: the 1 MiB string extras are cut from, and the bid channel and URL
    tables (``HOT_CHANNELS`` then ``channel-i``), as the reference's static caches."""
    rng = np.random.default_rng([seed, 0x4E584D4B])
    extra = rng.integers(ord("a"), ord("z") + 1, EXTRA_POOL_BYTES, dtype=np.uint8)
    count = len(HOT_CHANNELS) + CHANNELS_NUMBER
    # getBaseUrl: three nextString(random, 5, '_') parts (3 or 4 characters, 1 in 13 a '_')
    parts = [_ragged(np.where(rng.integers(0, 13, (count, 4)) == 0, np.uint8(ord("_")),
                              rng.integers(ord("a"), ord("z") + 1, (count, 4), dtype=np.uint8)),
                     rng.integers(3, 5, count)) for _ in range(3)]
    urls = pc.binary_join_element_wise(  # pyright: ignore[reportAttributeAccessIssue]
        "https://www.nexmark.com/", pc.binary_join_element_wise(*parts, "/"),  # pyright: ignore[reportAttributeAccessIssue]
        "/item.htm?query=1", "")
    channel = np.arange(count) - len(HOT_CHANNELS)
    with_id = (channel >= 0) & (rng.integers(0, 10, count) > 0)
    suffix = pa.array([f"&channel_id={abs(_reverse_int32(int(i)))}" if w else ""
                       for i, w in zip(channel, with_id)])
    channels = pa.array(list(HOT_CHANNELS) + [f"channel-{i}" for i in range(CHANNELS_NUMBER)])
    return extra, channels, pc.binary_join_element_wise(urls, suffix, "")  # pyright: ignore[reportAttributeAccessIssue]


def _reverse_int32(i: int) -> int:
    """Java's ``Integer.reverse`` (as a signed int)."""
    r = int(f"{i & 0xFFFFFFFF:032b}"[::-1], 2)
    return r - (1 << 32) if r >= 1 << 31 else r


@lru_cache(maxsize=8)
def _extra_table(seed: int, max_length: int) -> pa.Array:
    """``EXTRA_VARIANTS`` slices of the per-seed pool for every length ``0 .. max_length``
    (``StringsGenerator.nextExactString``); string ``length * EXTRA_VARIANTS + v``."""
    pool = _pools(seed)[0]
    rng = np.random.default_rng([seed, max_length, 0x45585452])
    lengths = np.repeat(np.arange(max_length + 1), EXTRA_VARIANTS)
    at = rng.integers(0, len(pool) - max_length, len(lengths))
    windows = np.lib.stride_tricks.sliding_window_view(pool, max(max_length, 1))
    return _ragged(windows[at], lengths)


def _next_extra(c: NexmarkConfig, n: np.ndarray, current_size: np.ndarray,
                average: int) -> pa.Array:
    """``StringsGenerator.nextExtra``: pads a record to ``average`` bytes on average
    (length uniform in ±20 % of what is missing), a slice of the per-seed pool."""
    desired = average - current_size
    delta = np.round(desired * 0.2).astype(np.int64)
    spread, variant = _fields(c.seed, n, _D_EXTRA_LEN, np.maximum(2 * delta, 1), EXTRA_VARIANTS)
    lengths = np.where(current_size > average, 0, desired - delta + np.where(delta == 0, 0, spread))
    longest = average + (average + 4) // 5  # desired + delta, when current_size is 0
    return _extra_table(c.seed, longest).take(pa.array(lengths * EXTRA_VARIANTS + variant))


def _pick(values: tuple[str, ...], index: np.ndarray) -> pa.Array:
    return pa.array(values).take(pa.array(index))


def _lengths(a: pa.Array) -> np.ndarray:
    return pc.utf8_length(a).to_numpy(zero_copy_only=False).astype(np.int64)  # pyright: ignore[reportAttributeAccessIssue]


# -- the three generators --------------------------------------------------------------------------

def _persons(n: np.ndarray, c: NexmarkConfig) -> pa.RecordBatch:
    seed = c.seed
    name = pc.binary_join_element_wise(  # pyright: ignore[reportAttributeAccessIssue]
        _pick(FIRST_NAMES, _below(seed, n, _D_FIRST, len(FIRST_NAMES))),
        _pick(LAST_NAMES, _below(seed, n, _D_LAST, len(LAST_NAMES))), " ")
    email = pc.binary_join_element_wise(  # pyright: ignore[reportAttributeAccessIssue]
        _next_string(c, n, _D_STR1, 7), _next_string(c, n, _D_STR2, 5), "@")
    email = pc.binary_join_element_wise(email, pa.scalar(".com"), "")  # pyright: ignore[reportAttributeAccessIssue]
    card = _credit_cards(seed, n)
    city = _pick(US_CITIES, _below(seed, n, _D_CITY, len(US_CITIES)))
    state = _pick(US_STATES, _below(seed, n, _D_STATE, len(US_STATES)))
    size = (8 + _lengths(name) + _lengths(email) + _lengths(card) + _lengths(city)
            + _lengths(state))
    columns = [last_base0_person_id(c, n) + FIRST_PERSON_ID, name, email, card, city, state,
               c.timestamp_for_event(n), _next_extra(c, n, size, c.avg_person_byte_size)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS[EventKind.PERSON])


def _credit_cards(seed: int, n: np.ndarray) -> pa.Array:
    """Four random groups of four digits separated by spaces (19 characters)."""
    groups = np.stack([_below(seed, n * 4 + g, _D_CARD, 10_000) for g in range(4)], axis=1)
    chars = np.full((len(n), 19), ord(" "), dtype=np.uint8)
    for g in range(4):
        for d in range(4):
            chars[:, g * 5 + d] = ord("0") + groups[:, g] // 10 ** (3 - d) % 10
    return _string_array(np.full(len(n), 19, dtype=np.int64), chars.ravel())


def _auctions(n: np.ndarray, c: NexmarkConfig) -> pa.RecordBatch:
    seed = c.seed
    hot = _below(seed, n, _D_HOT, c.hot_sellers_ratio) > 0
    seller = np.where(hot, last_base0_person_id(c, n) // HOT_BATCH * HOT_BATCH,
                      _next_base0_person_id(c, n, _D_ID)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + _below(seed, n, _D_CATEGORY, NUM_CATEGORIES)
    initial_bid = _next_price(c, n, _D_PRICE)
    timestamp = c.timestamp_for_event(n)
    # nextAuctionLengthMs: on average as long as it takes to create num_in_flight_auctions more
    ahead = c.num_in_flight_auctions * c.total_proportion // c.auction_proportion
    horizon = c.timestamp_for_event(n + ahead) - timestamp
    expires = timestamp + 1 + _below(seed, n, _D_LENGTH, np.maximum(horizon * 2, 1))
    item_name = _next_string(c, n, _D_STR1, 20)
    description = _next_string(c, n, _D_STR2, 100)
    reserve = initial_bid + _next_price(c, n, _D_PRICE2)
    size = 8 + _lengths(item_name) + _lengths(description) + 40
    columns = [last_base0_auction_id(c, n) + FIRST_AUCTION_ID, item_name, description,
               initial_bid, reserve, timestamp, expires, seller, category,
               _next_extra(c, n, size, c.avg_auction_byte_size)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS[EventKind.AUCTION])


def _bids(n: np.ndarray, c: NexmarkConfig) -> pa.RecordBatch:
    seed = c.seed
    hot_auction, hot_bidder, hot_channel = _fields(
        seed, n, _D_HOT, c.hot_auction_ratio, c.hot_bidders_ratio, HOT_CHANNELS_RATIO)
    # nextBase0AuctionId: one of the last num_in_flight_auctions, or a few ahead
    last_auction = last_base0_auction_id(c, n)
    low = np.maximum(last_auction - c.num_in_flight_auctions, 0)
    # nextBase0PersonId: one of the last num_active_people, or a few ahead
    people = last_base0_person_id(c, n) + 1
    active = np.minimum(people, c.num_active_people)
    auction_pick, bidder_pick, channel_pick = _fields(
        seed, n, _D_ID, last_auction - low + 1 + AUCTION_ID_LEAD, active + PERSON_ID_LEAD,
        CHANNELS_NUMBER)
    auction = np.where(hot_auction > 0, last_auction // HOT_BATCH * HOT_BATCH,
                       low + auction_pick) + FIRST_AUCTION_ID
    # a hot bidder is the second person of the batch, so that hot bidders and sellers differ
    bidder = np.where(hot_bidder > 0, (people - 1) // HOT_BATCH * HOT_BATCH + 1,
                      people - active + bidder_pick)
    # The reference (nexmark/nexmark BidGenerator.nextBid) adds FIRST_PERSON_ID twice.
    bidder = bidder + 2 * FIRST_PERSON_ID
    price = _next_price(c, n, _D_PRICE)
    _, channels, urls = _pools(seed)
    pick = pa.array(np.where(hot_channel > 0, channel_pick % len(HOT_CHANNELS),
                             len(HOT_CHANNELS) + channel_pick).astype(np.int32))
    columns = [auction, bidder, price, pa.DictionaryArray.from_arrays(pick, channels),
               pa.DictionaryArray.from_arrays(pick, urls), c.timestamp_for_event(n),
               _next_extra(c, n, np.full(len(n), 32, dtype=np.int64), c.avg_bid_byte_size)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS[EventKind.BID])


_GENERATORS = {EventKind.PERSON: _persons, EventKind.AUCTION: _auctions, EventKind.BID: _bids}
