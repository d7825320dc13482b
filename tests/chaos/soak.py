"""``./dev soak --minutes N``: new seeds of the exactly-once harness for N minutes.

Prints one line per seed (job, failures placed, seconds) and, for every failing
seed, its differences and a reproduction; exits 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time

from raystream.core.ray_start import ensure_ray
from tests.chaos.runner import run_scenario
from tests.chaos.scenarios import JobKind, generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, action="append",
                        help="run these seeds (repeatable) instead of new random ones")
    args = parser.parse_args(argv)
    ensure_ray(num_cpus=2, object_store_memory=1 << 30, log_to_driver=False)
    deadline = time.monotonic() + args.minutes * 60
    seeds = iter(args.seed) if args.seed else iter(lambda: random.randrange(10**9), None)
    failing, mix = [], collections.Counter()
    for seed in seeds:
        if not args.seed and time.monotonic() > deadline:
            break
        scenario = generate(seed)
        with tempfile.TemporaryDirectory(prefix=f"soak-{seed}-") as work:
            outcome = run_scenario(scenario, work)
            differences, placed = outcome.differences, outcome.placed
        mix[scenario.job.value] += 1
        for failure in scenario.failures:
            mix[failure.kind.value] += 1
        status = "ok" if not differences else "FAILED"
        print(f"{status} {scenario.describe()} | {'; '.join(placed)}", flush=True)
        if differences:
            failing.append(seed)
            print("  reproduce: ./dev soak --seed", seed, "\n ", repr(scenario), flush=True)
            for line in differences:
                print("  ", line, flush=True)
    print(f"mix: {dict(sorted(mix.items()))}")
    print(f"{sum(mix[job.value] for job in JobKind)} seeds, {len(failing)} failing: {failing}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
