"""Generated inputs: the columns of ``from_sequence`` sources (functions of the row
numbers ``i``), the arrays and frames fed to operators driven by hand, and the
constants that shape them. Deterministic: a seed, or the row numbers, fix every value."""

from __future__ import annotations

import numpy as np
import pandas as pd

# -- the exactly-once job: a running sum per key ----------------------------------------------

N = 24_000
KEYS = 37
SPLITS = 4


def numbers(i: np.ndarray) -> dict:
    """Key ``(i * 7) % KEYS``, value ``i + 1``, the row number and a count of one."""
    return {"k": (i * 7) % KEYS, "v": i + 1, "i": i, "n": np.ones(len(i), np.int64)}


# -- event time -------------------------------------------------------------------------------

BASE = 1_700_000_000_000  # the event time of row 0 of the jobs' sources


def make_input(seed: int, n: int = 400, keys: int = 5, disorder: int = 30
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, ts, x) of ``n`` rows about 3 ms apart, out of order by up to ``disorder``."""
    rng = np.random.default_rng(seed)
    ts = np.arange(n) * 3 + rng.integers(-disorder, disorder + 1, n) + 1000
    return (rng.integers(0, keys, n), ts, rng.integers(-50, 50, n).astype(np.float64))


def user_events(i: np.ndarray) -> dict:
    """37 users, one row per 5 ms of event time, out of order by up to 400 ms."""
    jitter = (i * 7919) % 400
    return {"user": i % 37, "ts": BASE + i * 5 - jitter, "x": (i % 11).astype(np.float64)}


def with_stragglers(i: np.ndarray) -> dict:
    """In order, except every 500th record after the first 1000 is a minute late:
    late under any interleaving of the subtasks."""
    straggler = (i % 500 == 499) & (i > 1000)
    return {"user": i % 37, "ts": BASE + i * 5 - np.where(straggler, 60_000, 0),
            "x": (i % 11).astype(np.float64)}


# -- joins ------------------------------------------------------------------------------------

STRAGGLER_START = 2000  # join_events: every 400th row after this one is a minute late


def join_events(i: np.ndarray) -> dict:
    """One row per 2 ms of event time, disordered by up to 40 ms (within the 100 ms
    bound); every 400th row after the first 2000 is a minute late: late at the join
    under any interleaving (both sides come from one reader). ``side`` 0 is left."""
    straggler = (i % 400 == 399) & (i > STRAGGLER_START)
    jitter = (i * 7919) % 41
    return {"id": i, "k": (i * 31) % 23, "side": (i * 13) % 5 % 2,
            "ts": BASE + i * 2 + jitter - np.where(straggler, 60_000, 0)}


def join_input(rng: np.random.Generator, n: int, keys: int, disorder: int) -> pd.DataFrame:
    """``n`` rows of both sides (``side`` 0 left) about 8 ms apart, disordered by up to
    ``disorder`` ms, ids 0 to n - 1."""
    ts = BASE + np.sort(rng.integers(0, 8 * n, n)) + rng.integers(0, disorder + 1, n)
    return pd.DataFrame({"id": np.arange(n), "k": rng.integers(0, keys, n), "ts": ts,
                         "side": rng.integers(0, 2, n)})


# -- sessions ---------------------------------------------------------------------------------

def session_input(seed: int, n: int, keys: int, jitter: int, straggle: int = 300
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, ts, x): times mostly in order (out of order by up to ``jitter``), with a few
    stragglers ``straggle`` ms back: far beyond any bound at 300, inside their key's open
    session often at 80."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.integers(0, 4, n)) + 1000 - rng.integers(0, jitter + 1, n)
    ts[rng.random(n) < 0.03] -= straggle
    return rng.integers(0, keys, n), ts, rng.integers(-50, 50, n).astype(np.float64)


BLOCK, JOB_GAP = 700, 100  # session_events: a 300 ms jump per BLOCK rows, beyond the gap


def session_events(i: np.ndarray) -> dict:
    """Seven users; every ``BLOCK`` records time jumps 300 ms: one session per user and
    block (of gap ``JOB_GAP``)."""
    return {"user": i % 7, "ts": 1_000_000 + i * 2 + (i // BLOCK) * 300,
            "x": (i % 11).astype(np.float64)}
