"""A deadline for every test that runs a job: no test holds the run hostage.

pytest-timeout ends a stuck test at ``timeout`` (pyproject.toml) with a stack
dump of the pytest process, which says nothing of the job that did not end.
Well before that, at the test's deadline, this plugin asks every job started
during the test and still running why it has not finished
(``JobClient.diagnosis``: the subtasks that have not reported end of input and
what each waits for, the checkpoints in progress), cancels it, and fails the
test with that diagnosis, printed in the test's report.

The deadline is ``DEFAULT_DEADLINE_S``, or four fifths of a test's own
``@pytest.mark.timeout``; ``@pytest.mark.deadline(seconds)`` sets another for a
test that must run longer (it must stay under pytest-timeout's).
"""

from __future__ import annotations

import threading
import time

import pytest

DEFAULT_DEADLINE_S = 150.0
_FIRED = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deadline(seconds): fail the test, cancelling its running jobs with a "
                   "diagnosis of each, once it has run this long (default "
                   f"{DEFAULT_DEADLINE_S:.0f} s)")


def deadline_of(item: pytest.Item) -> float:
    """The ``deadline`` mark's; else, for a test given a ``timeout`` of its own, four
    fifths of it (a diagnosis before pytest-timeout's dump); else the default."""
    marker = item.get_closest_marker("deadline")
    if marker is not None:
        return float(marker.args[0])
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args:
        return 0.8 * float(timeout.args[0])
    return DEFAULT_DEADLINE_S


def running_jobs(since: float) -> list[dict]:
    """The summaries of this cluster's jobs started at or after ``since`` and not ended."""
    import ray

    from raystream.engine import registry

    if not ray.is_initialized():
        return []
    return [job for job in registry.all_jobs()
            if job["status"] not in registry.TERMINAL_STATUSES
            and (job.get("started_at") or 0) >= since - 1.0]


def diagnose_and_cancel(since: float) -> str:
    """Ask each job started since ``since`` and still running why it has not ended, then
    cancel it; what they said."""
    import raystream as rs

    lines = []
    for job in running_jobs(since):
        try:
            client = rs.JobClient.attach(job["job_id"])
            lines.append(str(client.diagnosis()))
            client.cancel()
        except Exception as exc:  # it ended meanwhile, or its master does not answer
            lines.append(f"job {job['name']} ({job['status']}): no diagnosis: "
                         f"{type(exc).__name__}: {exc}".splitlines()[0])
    return "\n".join(lines) or "no job of this test was running"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    started, deadline = time.time(), deadline_of(item)

    def fire() -> None:
        item.stash[_FIRED] = (f"the test ran past its deadline of {deadline:.0f} s; "
                              f"its running jobs were cancelled:\n"
                              + diagnose_and_cancel(started))

    timer = threading.Timer(deadline, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a diagnosis under way is finished and stashed before the report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    fired = item.stash.get(_FIRED, None)
    if call.when == "call" and fired is not None:
        report.outcome = "failed"
        report.longrepr = f"{fired}\n\n{report.longrepr or ''}"
