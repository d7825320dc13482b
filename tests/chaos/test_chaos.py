"""The exactly-once harness on a fixed set of seeds (``./dev soak`` runs new ones).

Each seed is a job with late data and one to four failures (failpoints, SIGKILLs
of subtask processes after checkpoints, while deploying or while stopping, a stop
with a savepoint restored at another parallelism, a storage outage, a corrupted
newest checkpoint), checked against a numpy model or the same job run without
failures.
"""

from __future__ import annotations

import pytest

from tests.chaos.runner import run_scenario
from tests.chaos.scenarios import generate

CI_SEEDS = list(range(1, 9))


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_seed_is_exactly_once(ray_session, tmp_path, seed):
    outcome = run_scenario(generate(seed), str(tmp_path))
    assert outcome.ok, (f"{outcome.scenario.describe()}\nplaced: {outcome.placed}\n"
                        f"reproduce: {outcome.scenario!r}\n" + "\n".join(outcome.differences))
