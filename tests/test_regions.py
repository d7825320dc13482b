"""Pipelined regions of real job plans (engine/regions.py): no Ray.

The expected regions are written out by hand from the rule in
docs/architecture.md: forward edges join subtask i to subtask i, every other
edge joins everything on both sides, and the edge into an exactly-once sink's
committer joins nothing.
"""

from __future__ import annotations

import raystream as rs
from raystream.checkpoint.config import CheckpointConfig
from raystream.engine.regions import Regions


def _env(tmp_path, parallelism: int = 2) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(parallelism=parallelism,
                                checkpoints=CheckpointConfig(storage=str(tmp_path / "ck")))


def _named(env: rs.StreamEnvironment, regions: Regions) -> list[list[str]]:
    plan = env.plan()
    return [sorted(f"{plan.vertices[v].name}[{i}]" for v, i in region)
            for region in regions.regions]


def test_an_embarrassingly_parallel_job_has_a_region_per_subtask_and_the_committer(tmp_path):
    env = _env(tmp_path)
    env.from_sequence(100).map_batches(lambda b: b, name="m").sink_to_parquet(
        str(tmp_path / "out"), name="pq")
    regions = Regions.of_plan(env.plan())
    assert _named(env, regions) == [["sequence -> m -> pq[0]"], ["sequence -> m -> pq[1]"],
                                    ["pq-committer[0]"]]
    assert regions.restart_set((0, 1)) == frozenset({(0, 1)})
    assert regions.restart_set((1, 0)) is None  # the committer fails: the job restarts


def test_unchained_forward_edges_join_subtask_i_to_subtask_i(tmp_path):
    env = _env(tmp_path, parallelism=3)
    source = env.from_sequence(100)
    source.union(env.from_sequence(50)).collect(name="out")  # union: forward, not chained
    plan = env.plan()
    regions = Regions.of_plan(plan)
    assert len(regions.regions) == 4  # three pipelines of two sources each, the committer
    for region in regions.regions[:3]:
        assert len({index for _, index in region}) == 1  # one subtask index per region


def test_a_keyed_job_is_one_region_and_restarts_globally(tmp_path):
    env = _env(tmp_path)
    env.from_sequence(100).key_by("id").map_batches(lambda b: b, name="m").collect(name="out")
    regions = Regions.of_plan(env.plan())
    assert _named(env, regions) == [["m -> out[0]", "m -> out[1]", "sequence[0]", "sequence[1]"],
                                    ["out-committer[0]"]]
    assert regions.restart_set((0, 0)) is None  # only the committer would survive


def test_rebalance_and_broadcast_join_everything(tmp_path):
    for shuffle in ("rebalance", "broadcast"):
        env = _env(tmp_path)
        stream = env.from_sequence(100, parallelism=1).map_batches(lambda b: b, name="m")
        getattr(stream, shuffle)().map_batches(lambda b: b, name="n").collect(name="out")
        regions = Regions.of_plan(env.plan())
        # sequence x1, m x2 (behind an implicit rebalance), n x2; the committer
        assert [len(r) for r in regions.regions] == [5, 1], shuffle
        assert regions.restart_set((1, 1)) is None


def test_a_job_at_parallelism_one_is_one_region(tmp_path):
    env = _env(tmp_path, parallelism=1)
    env.from_sequence(100).map_batches(lambda b: b, name="m").collect(name="out")
    regions = Regions.of_plan(env.plan())
    assert _named(env, regions) == [["sequence -> m -> out -> out-committer[0]"]]
    assert regions.restart_set((0, 0)) is None
