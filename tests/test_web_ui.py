"""The web UI in a real browser: headless Chromium (Debian's, installed by ``./dev``)
driven through Debian's chromedriver with Selenium, against the UI served from this
process while a real keyed job with checkpoints runs on Ray.

It checks what a person would: the job graph's chains, a records/s figure that changes
while the job runs, a completed checkpoint row, and the stop button, which must stop the
job with a savepoint (seen through the client API) from which a second run finishes the
input with exactly-once output (checked against pandas). A screenshot goes to docs/ui.png.

Selenium rather than Playwright: Debian ships chromedriver built from the same source as
its Chromium, so the two always match, and Selenium is pure Python; Playwright's Python
package carries its own Node.js driver, whose protocol version need not match Debian's
Chromium.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import raystream as rs
from raystream.engine.ui.server import create_app, start_in_background
from tests.support.pacing import Throttle

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
N = 120_000  # rows; held back by the throttle so the job runs long enough to be watched
KEYS = 7
WAIT_S = 120  # the longest the browser waits for one thing the page should come to show
# One WebDriver command's longest wait: a command that finds the renderer busy (a fresh CI
# run once saw chromedriver answer nothing for selenium's default 120 s) counts as "not shown
# yet" and is asked again within WAIT_S, instead of spending the test's whole deadline.
COMMAND_S = 15


throttle = Throttle(0.05)


def build(env: rs.StreamEnvironment, base_ms: int) -> rs.SinkHandle:
    """A keyed running sum per key: its output is exactly once only if no row is lost or
    counted twice across the failure, the stop and the restore. Event time runs a
    millisecond a row up to ``base_ms`` (the wall clock at the start), so the watermark
    lag (wall clock minus watermark) is a figure to show and never negative: rows read
    faster than one a millisecond would otherwise carry event times ahead of the clock."""
    rows = env.from_sequence(
        N, columns=lambda i: {"k": i % KEYS, "id": i, "total": i + 1, "ts": base_ms - N + i},
        batch_size=250, num_splits=4, name="numbers",
        watermarks=rs.BoundedOutOfOrderness("ts", 1000))
    return (rows.map_batches(throttle, name="throttle")
            .key_by("k").reduce(lambda acc, row: {**row, "total": acc["total"] + row["total"]},
                                name="running-sum")
            .collect(name="out"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium could not be installed (./dev installs Debian's chromium and "
                    "chromium-driver when run as root; otherwise: sudo apt-get install "
                    "chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1500,1250",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.command_executor.client_config.timeout = COMMAND_S
    yield driver
    driver.quit()


def text(driver, selector: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", selector).text
    except (NoSuchElementException, StaleElementReferenceException):  # redrawn meanwhile
        return ""


def wait_for(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    from urllib3.exceptions import ReadTimeoutError

    # a command the busy browser left unanswered for COMMAND_S is asked again
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.2,
                         ignored_exceptions=(ReadTimeoutError,)).until(
        lambda d: condition(d), message=f"the page never showed {what}")


DURATION = re.compile(r"\d+(\.\d)? (ms|s|min|h|days|years)")
PROGRESS = re.compile(r"(?P<phase>[^·]+) · read (?P<read>[\d,]+) of (?P<total>[\d,]+) rows "
                      r"\(\d+%\) · [\d,]+ rows/s · written [\d,]+ rows · "
                      r"watermark \d{4}-\d\d-\d\dT")


def number(value: str) -> float | None:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None


def test_watch_and_stop_a_running_job(ray_session, browser, tmp_path):
    url = start_in_background(port=0)
    base_ms = int(time.time() * 1000)
    # one failure (a user-function error in the keyed chain) that the job restarts after
    failure = rs.Failpoint("in_processing", operator="running-sum", subtask=0, hit=40,
                           action="raise")
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        storage=str(tmp_path / "checkpoints"), interval_s=0.5), failpoints=[failure])
    sink = build(env, base_ms)
    plan = env.plan()
    client = env.execute_async("ui-watched")
    browser.get(f"{url}#job={client.job_id}")

    # the graph: every chain of the plan, with its parallelism and its input's partitioning
    for vertex in plan.vertices:
        box = f'.vertex[data-vertex="{vertex.name}"]'
        wait_for(browser, lambda d: f"×{vertex.parallelism}" in text(d, f"{box} .name"),
                 f"chain {vertex.name} ×{vertex.parallelism}")
    labels = {e.text for e in browser.find_elements("css selector", "#graph text.partitioning")}
    assert labels == {str(e.partitioning) for v in plan.vertices for e in v.inputs}
    assert any(label.startswith("hash(") for label in labels)  # the key_by edge

    # the failure, with the restart that followed and the subtask's traceback
    wait_for(browser, lambda d: "restarted from checkpoint" in text(d, "#failures summary"),
             "the failure and the restart")
    # and its recovery by stage, up to the first record a sink processed after the restore
    wait_for(browser, lambda d: "first record" in text(d, "#failures summary"),
             "the recovery's stages")
    summary = text(browser, "#failures summary")
    assert re.search(r"cancelled [\d.]+ s, deployed [\d.]+ s, restored [\d.]+ s, "
                     r"first record [\d.]+ s", summary), summary
    # the failure raised: every actor lived, and every subtask restored its own state locally
    assert re.search(r"; (\d+) of \1 subtasks restored locally", summary), summary
    assert "in running-sum" in summary and "InjectedFailure" in summary, summary
    trace = browser.find_element("css selector", "#failures pre").get_attribute("textContent")
    assert "Traceback (most recent call last)" in trace and "InjectedFailure" in trace, trace

    # a live rate: the source chain's records/s is a number, then another number
    source = plan.vertices[0].name
    rate = f'.vertex[data-vertex="{source}"] .rate-out'
    first = wait_for(browser, lambda d: (number(text(d, rate)) or 0) > 0 and text(d, rate),
                     "a records/s figure")
    wait_for(browser, lambda d: (number(text(d, rate)) or 0) > 0 and text(d, rate) != first,
             "the records/s figure change")

    # a completed checkpoint in the history table, and the chart drawn
    wait_for(browser, lambda d: d.find_elements(
        "css selector", '#checkpoints tr[data-status="COMPLETED"]'), "a completed checkpoint")
    assert browser.find_elements("css selector", "#chart-time canvas")
    assert text(browser, "#job-status") == "RUNNING"
    # the watermark lag of each chain with an input: a duration, its milliseconds in data-ms
    lags = [browser.find_element("css selector", f'.vertex[data-vertex="{v.name}"] .lag')
            for v in plan.vertices if v.inputs]
    assert lags and all((number(lag.get_attribute("data-ms") or "") or -1) >= 0
                        and DURATION.fullmatch(lag.text) for lag in lags), [
        (lag.text, lag.get_attribute("data-ms")) for lag in lags]
    # the job's progress: its phase, the share of its bounded input read, its watermark
    line = wait_for(browser, lambda d: PROGRESS.search(text(d, "#job-progress")),
                    "the job's progress")
    assert line["phase"].startswith("running") and 0 < int(line["read"].replace(",", "")) <= N, line
    assert int(line["total"].replace(",", "")) == N
    assert DURATION.fullmatch(text(browser, "#job-lag")), text(browser, "#job-lag")

    # the savepoint button: JobClient.savepoint, as `raystream savepoint`; the job runs on
    path = browser.find_element("css selector", "#savepoint-path")
    path.send_keys(str(tmp_path / "savepoint-running"))
    browser.find_element("css selector", "#savepoint-button").click()
    wait_for(browser, lambda d: "savepoint: savepoint written to" in text(d, "#message"),
             "the savepoint answered")
    wait_for(browser, lambda d: d.find_elements(
        "css selector", '#checkpoints tr[data-status="COMPLETED"] td.savepoint:not(:empty)'),
        "the savepoint in the checkpoint history")
    assert client.status() == "RUNNING"
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1500, height + 140)  # the whole page, failures included
    browser.save_screenshot(str(ROOT / "docs" / "ui.png"))

    # the stop button: JobClient.stop_with_savepoint, as `raystream stop --savepoint`
    savepoint = str(tmp_path / "savepoint")
    path.clear()
    path.send_keys(savepoint)
    browser.find_element("css selector", "#stop-button").click()
    wait_for(browser, lambda d: "stop: FINISHED" in text(d, "#message"), "the stop answered")
    wait_for(browser, lambda d: text(d, "#job-status") == "FINISHED", "the job FINISHED")
    first_run = client.wait()
    assert first_run.status == "FINISHED" and client.status() == "FINISHED"
    assert first_run.restarts == 1
    before = first_run.table(sink).to_pandas()
    assert 0 < len(before) < N, "the stop came before the end of the input"

    # the savepoint holds the rest: a second run from it ends the input, exactly once
    env2 = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        storage=str(tmp_path / "checkpoints2"), interval_s=0.5))
    sink2 = build(env2, base_ms)
    after = env2.execute("ui-watched-rest", restore_from=savepoint).table(sink2).to_pandas()
    out = pd.concat([before, after], ignore_index=True)
    ids = np.arange(N)
    oracle = pd.DataFrame({"k": ids % KEYS, "value": ids + 1}).groupby("k")["value"].sum()
    assert sorted(out["id"]) == list(ids)  # every row once: none lost, none twice
    assert out.groupby("k")["total"].max().to_dict() == oracle.to_dict()
    # each key's sums, in the order they grew, add exactly the row that came with them:
    # a row counted twice, or replayed into restored state, would break the chain
    for _, group in out.groupby("k"):
        group = group.sort_values("total")
        added = np.diff(group["total"].to_numpy(), prepend=0)
        assert (added == group["id"].to_numpy() + 1).all()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    return request(urllib.request.Request(url, headers=headers or {}))


def post(url: str, headers: dict[str, str], body: bytes = b"{}") -> tuple[int, str]:
    return request(urllib.request.Request(url, data=body, headers=headers, method="POST"))


def request(req: urllib.request.Request) -> tuple[int, str]:
    """The status and body of an answer, errors included."""
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_token_is_required_off_loopback(ray_session, tmp_path):
    """What ``--host`` other than loopback turns on, served here on loopback: Ray's token
    (the embedded Ray of the tests has token authentication on) or nothing."""
    import asyncio
    import threading

    from aiohttp import web
    from ray._raylet import AuthenticationTokenLoader

    token = AuthenticationTokenLoader.instance().get_token_for_http_header()["authorization"]
    token = token.removeprefix("Bearer ")
    app = create_app(require_token=True)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    threading.Thread(target=loop.run_forever, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        assert get(f"{base}/api/jobs")[0] == 401
        assert get(f"{base}/api/jobs", {"Authorization": "Bearer not-the-token"})[0] == 403
        status, body = get(f"{base}/api/jobs", {"Authorization": f"Bearer {token}"})
        assert status == 200 and isinstance(json.loads(body), list)
        assert get(f"{base}/?token=not-the-token")[0] == 403
        browser = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        browser.request("GET", f"/?token={token}")  # a browser's way in: the cookie, then /
        answer = browser.getresponse()
        assert answer.status == 302 and answer.getheader("Location") == "/"
        cookie = answer.getheader("Set-Cookie").split(";")[0]
        assert cookie == f"ray-authentication-token={token}"
        status, page = get(f"{base}/", {"Cookie": cookie})
        assert status == 200 and "<title>raystream</title>" in page
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)


def test_raystream_ui_refuses_other_addresses_without_token_authentication():
    """``raystream ui --host`` beyond loopback with token authentication off: one line
    that says what to do, before binding anything or connecting to a cluster."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    refused = subprocess.run([sys.executable, "-m", "raystream.cli", "ui", "--host", "192.0.2.1"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "behind Ray's token" in lines[0] and "RAY_AUTH_MODE=token" in \
        lines[0], refused.stderr


def test_raystream_ui_serves_the_clusters_jobs(ray_session, tmp_path):
    """``raystream ui`` in a process of its own, connected to this session's Ray: it lists
    a job this process ran, with its graph and final figures, and answers a bad job name."""
    import os
    import subprocess
    import sys

    import ray

    env = rs.StreamEnvironment(parallelism=2)
    sink = env.from_sequence(1000, num_splits=2, name="few").key_by("id").reduce(
        lambda acc, row: row, name="latest").collect()
    client = env.execute_async("ui-listed")
    assert client.wait().table(sink).num_rows == 1000  # the oracle: every row once
    child_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    address = ray.get_runtime_context().gcs_address
    ui = subprocess.Popen([sys.executable, "-m", "raystream.cli", "ui", "--address", address,
                           "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=child_env, text=True)
    try:
        line = ui.stdout.readline()
        assert line.startswith("raystream ui: serving http://127.0.0.1:"), (
            line + ui.stderr.read() if ui.poll() is not None else line)
        url = line.split()[3]
        status, body = get(f"{url}api/jobs")
        assert status == 200
        listed = {job["job_id"]: job for job in json.loads(body)}
        assert listed[client.job_id]["status"] == "FINISHED"
        status, body = get(f"{url}api/jobs/{client.job_id}")
        job = json.loads(body)
        assert status == 200 and not job["live"]
        graph = {v["name"]: v for v in job["graph"]}
        assert set(graph) == {v.name for v in env.plan().vertices}
        # final figures: the source chain sent every row, the keyed chain received them
        assert graph[env.plan().vertices[0].name]["records_out"] == 1000
        assert graph[env.plan().vertices[1].name]["records_in"] == 1000
        # another site open in the same browser cannot act on jobs, nor read them through
        # a name of its own resolved to loopback
        port = urllib.parse.urlsplit(url).port
        assert get(f"{url}api/jobs", {"Host": f"rebound.example:{port}"})[0] == 403
        for headers in ({"Content-Type": "text/plain"},
                        {"Content-Type": "application/json", "Origin": "http://example.com"}):
            status, body = post(f"{url}api/jobs/{client.job_id}/cancel", headers)
            assert status in (415, 403) and "error" in json.loads(body), (status, body)
        status, body = get(f"{url}api/jobs/no-such-job")
        assert status == 404 and "no job 'no-such-job'" in json.loads(body)["error"]
    finally:
        ui.terminate()  # the process this test started, by its handle
        ui.wait(timeout=30)


def test_rates_restart_with_new_subtasks_and_failures_pair_with_restarts():
    """The figures the page shows, from summaries and samples made up for the edge cases:
    a restarted job's counters start again (no negative rate), two polls too close give
    the last rates, and each failure is paired with the restart that followed it."""
    from raystream.engine.ui.views import RateTracker, failure_rows, vertex_figures

    graph = [{"id": 0, "name": "src", "parallelism": 2, "operators": ["src"], "inputs": []},
             {"id": 1, "name": "sum", "parallelism": 1, "operators": ["sum"],
              "inputs": [{"from": 0, "partitioning": "hash(k)"}]}]
    rates = RateTracker()
    assert rates.update({"src/0": {"records_out": 100}}, 0.0) == {}
    assert rates.update({"src/0": {"records_out": 300}}, 2.0)["src/0"]["records_out"] == 100.0
    assert rates.update({"src/0": {"records_out": 900}}, 2.1)["src/0"]["records_out"] == 100.0
    assert rates.update({"src/0": {"records_out": 50}}, 4.0) == {}  # restarted: counts anew
    sample = {"src/0": {"records_out": 250, "backpressure": 0.1},
              "src/1": {"records_out": 10, "backpressure": 0.7}, "sum/0": {"records_in": 5}}
    figures = {v["name"]: v for v in vertex_figures(graph, sample, rates.update(sample, 6.0))}
    assert figures["src"]["records_out_per_s"] == 100.0  # src/1 has no earlier sample
    assert figures["src"]["backpressure"] == 0.7 and figures["src"]["records_out"] == 260
    assert figures["sum"]["watermark_lag_ms"] is None and figures["sum"]["records_in"] == 5
    assert figures["src"]["pools"] == []  # no model pool in the chain
    pooled = {"sum/0": {"sum.pool_size": 3, "sum.pool_queue": 2, "sum.pool_busy_s": 1.5,
                        "sum.pool_batch_latency_ms": 80.0}}
    (pool,) = {v["name"]: v for v in vertex_figures(graph, pooled, {})}["sum"]["pools"]
    assert pool == {"operator": "sum", "actors": 3, "queue": 2, "busy_s": 1.5,
                    "latency_ms": 80.0}

    summary = {"failures": ["boom", "bang"],
               "failure_details": [{"attempt": 0, "at": 1.0, "error": "boom", "operator": "sum",
                                    "subtask": 0, "traceback": "Traceback ..."},
                                   {"attempt": 1, "at": 2.0, "error": "bang", "operator": "sum",
                                    "subtask": None, "traceback": None}],
               "restores": [{"attempt": 1, "checkpoint_id": 4, "restore_s": 0.5}]}
    rows = failure_rows(summary)
    assert [(r["error"], r["restarted"], r["restored_checkpoint"]) for r in rows] == [
        ("boom", True, 4), ("bang", False, None)]  # the second failure ended the job
    legacy = failure_rows({"failures": ["boom"], "restores": []})  # a summary without details
    assert legacy[0]["error"] == "boom" and legacy[0]["traceback"] is None
