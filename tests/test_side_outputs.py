"""Side outputs of a keyed process function (``ctx.output(tag, row)``), exactly once.

The function keeps a count per key, yields every row with its count on the main
output and sends each tenth row of a key to side output "every-tenth"; both
outputs are checked with pandas against the input, with a failure placed in the
middle of the run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from tests.support.pacing import Throttle

throttle = Throttle(0.02)

N, KEYS = 6_000, 7


class Tenth(rs.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process_element(self, row, ctx):
        count = self.count.value() + 1
        self.count.update(count)
        if count % 10 == 0:
            ctx.output("every-tenth", {"k": row["k"], "i": row["i"], "count": count})
        yield {"k": row["k"], "i": row["i"], "count": count}


@pytest.mark.slow
def test_side_output_of_a_process_function_is_exactly_once(ray_session, tmp_path):
    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="tenth", subtask=1, hit=5)],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    counted = env.from_sequence(N, lambda i: {"k": i % KEYS, "i": i}, batch_size=100) \
        .map_batches(throttle, name="throttle").key_by("k").process(Tenth(), name="tenth")
    main = counted.collect(name="main")
    tenth = counted.side_output("every-tenth").collect(name="tenth-rows")
    result = env.execute("side-outputs")
    assert result.restarts == 1

    # counts follow arrival order (two readers interleave): check what holds in any order
    got_main = result.table(main).to_pandas().sort_values("i", ignore_index=True)
    got_tenth = result.table(tenth).to_pandas().sort_values("i", ignore_index=True)
    assert np.array_equal(got_main["i"], np.arange(N))  # every row once
    assert (got_main["k"] == got_main["i"] % KEYS).all()
    sizes = pd.Series(np.arange(N) % KEYS).value_counts()
    for key, counts in got_main.groupby("k")["count"]:
        assert sorted(counts) == list(range(1, sizes[key] + 1))
    # the side output holds exactly the main output's rows with a count divisible by 10
    expected = got_main[got_main["count"] % 10 == 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(got_tenth[["k", "i", "count"]], expected[["k", "i", "count"]],
                                  check_dtype=False)
    assert len(got_tenth) == sum(n // 10 for n in sizes)


def test_a_side_output_tag_must_be_a_name(ray_session):
    class Bad(rs.KeyedProcessFunction):
        def process_element(self, row, ctx):
            ctx.output("", row)

    env = rs.StreamEnvironment()
    env.from_sequence(10, lambda i: {"k": i}).key_by("k").process(Bad(), name="bad").collect()
    with pytest.raises(rs.JobFailedError, match="bad.*side output tag"):
        env.execute("bad-tag")
