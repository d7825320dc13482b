"""The web UI's HTTP server (aiohttp): the page, its static files and a JSON API.

    GET  /                          the page (engine/ui/static/index.html)
    GET  /api/jobs                  the cluster's jobs (the job directory)
    GET  /api/jobs/{job}            one job: graph with live figures per chain, checkpoint
                                    history, failures and restarts (the page polls it every second)
    POST /api/jobs/{job}/savepoint  {"path": ...}: JobClient.savepoint, as `raystream savepoint`
    POST /api/jobs/{job}/stop       {"path": ..., "drain": false}: JobClient.stop_with_savepoint,
                                    as `raystream stop`
    POST /api/jobs/{job}/cancel     JobClient.cancel, as `raystream cancel`

It serves loopback (127.0.0.1) by default. Bound to any other address it requires the
Ray cluster's token (Ray's own aiohttp middleware checks it: an ``Authorization: Bearer``
header, or the ``ray-authentication-token`` cookie that opening ``/?token=TOKEN`` once
sets), and refuses to start where token authentication is off.

    >>> url = start_in_background(port=0)  # doctest: +SKIP
    >>> url  # doctest: +SKIP
    'http://127.0.0.1:40123/'
"""

from __future__ import annotations

import asyncio
import threading
import time
from importlib import resources
from typing import Any, Callable, cast

from aiohttp import web

from raystream.core.ray_start import is_loopback
from raystream.engine.errors import JobNotFoundError, RaystreamError
from raystream.engine.ui.views import (MIN_SAMPLE_GAP_S, RateTracker, checkpoint_rows,
                                       failure_rows, job_row, vertex_figures)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8290
STATIC = resources.files("raystream.engine.ui") / "static"
TOKEN_COOKIE = "ray-authentication-token"  # the cookie Ray's dashboard uses, and its middleware reads


class UIError(RaystreamError):
    """The UI cannot serve as asked (an address without token authentication, say)."""


def create_app(*, require_token: bool = False) -> web.Application:
    """The aiohttp application; ``require_token``: check Ray's token on every request."""
    middlewares = [_same_origin]
    if require_token:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        from ray._private.authentication.http_token_authentication import \
            get_token_auth_middleware
        import aiohttp

        if not is_token_auth_enabled():
            raise UIError("the UI serves other machines only behind Ray's token: start the "
                          "cluster and this command with RAY_AUTH_MODE=token and the cluster's "
                          "token (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN), or "
                          "serve on loopback (--host 127.0.0.1) and use an SSH tunnel")
        middlewares += [_token_from_query, get_token_auth_middleware(aiohttp)]
    app = web.Application(middlewares=middlewares)
    app[JOBS] = JobsView()
    app[ON_LOOPBACK] = not require_token
    app.router.add_get("/", _index)
    app.router.add_static("/static/", str(STATIC))
    app.router.add_get("/api/jobs", _jobs)
    app.router.add_get("/api/jobs/{job}", _job)
    app.router.add_post("/api/jobs/{job}/savepoint", _savepoint)
    app.router.add_post("/api/jobs/{job}/stop", _stop)
    app.router.add_post("/api/jobs/{job}/cancel", _cancel)
    return app


@web.middleware
async def _same_origin(request: web.Request, handler: Any) -> web.StreamResponse:
    """Only this page may act on jobs: another site open in the same browser could send
    a form to a UI on loopback (no token there). A POST must be JSON (a cross-site one
    then needs the browser's preflight, which this server never allows) and, when the
    browser names the page it comes from, come from this server's own origin. On
    loopback, the address asked for must be a loopback one too (a site whose name was
    made to resolve to 127.0.0.1 would be its own origin: DNS rebinding)."""
    if request.app[ON_LOOPBACK] and not is_loopback(request.url.host or ""):
        return web.json_response({"error": f"this UI serves loopback only, not "
                                           f"{request.host}"}, status=403)
    if request.method == "POST":
        if request.content_type != "application/json":
            return web.json_response({"error": "send JSON (Content-Type: application/json)"},
                                     status=415)
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return web.json_response({"error": f"requests from {origin} are refused"},
                                     status=403)
    return await handler(request)


@web.middleware
async def _token_from_query(request: web.Request, handler: Any) -> web.StreamResponse:
    """``/?token=TOKEN``: a browser's way in. A valid token becomes the cookie Ray's
    middleware reads, and the page reloads without it in the address."""
    token = request.query.get("token")
    if token is None:
        return await handler(request)
    from ray._private.authentication.authentication_utils import validate_request_token

    if not validate_request_token("Bearer " + token):
        return web.Response(status=403, text="Forbidden: invalid token")
    rest = {k: v for k, v in request.query.items() if k != "token"}
    response = web.HTTPFound(request.rel_url.with_query(rest))
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
    raise response


class JobsView:
    """Reads the job directory and the running jobs' masters (blocking Ray calls, run on
    worker threads); keeps each job's last metrics sample for its rates."""

    def __init__(self) -> None:
        self._rates: dict[str, RateTracker] = {}

    def jobs(self) -> list[dict[str, Any]]:
        from raystream.engine import registry
        from raystream.engine.live_jobs import live_masters, status_of

        live = live_masters()
        return [job_row(job, status_of(job, live)) for job in reversed(registry.all_jobs())]

    def job(self, job: str) -> dict[str, Any]:
        from raystream.engine import registry
        from raystream.engine.live_jobs import live_masters, metrics_of, progress_of, status_of

        summary = registry.find_job(job)
        live = live_masters()
        status = status_of(summary, live)
        metrics = metrics_of(summary, live)
        running = status == "RUNNING"
        tracker = self._rates.get(summary["job_id"])
        if tracker is None and running:  # a job's first view: two samples, so it has rates
            tracker = self._rates[summary["job_id"]] = RateTracker()
            tracker.update(metrics, time.monotonic())
            time.sleep(MIN_SAMPLE_GAP_S)
            metrics = metrics_of(summary, live)
        rates = tracker.update(metrics, time.monotonic()) if running and tracker else {}
        return {**job_row(summary, status), "plan": summary.get("plan", ""),
                "error": summary.get("error"),
                "graph": vertex_figures(summary.get("graph") or [], metrics, rates),
                "checkpoints": checkpoint_rows(summary), "failures": failure_rows(summary),
                "progress": progress_of(summary, live), "live": running}

    @staticmethod
    def client(job: str) -> Any:
        from raystream.engine.client import JobClient

        return JobClient.attach(job)


JOBS = web.AppKey("jobs", JobsView)
ON_LOOPBACK = web.AppKey("on loopback", bool)  # no token: loopback addresses only


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(str(STATIC / "index.html"))


async def _jobs(request: web.Request) -> web.Response:
    return web.json_response(await asyncio.to_thread(request.app[JOBS].jobs),
                             dumps=_dumps)


async def _job(request: web.Request) -> web.Response:
    return await _answer(request.app[JOBS].job, request.match_info["job"])


async def _savepoint(request: web.Request) -> web.Response:
    body = await _body(request)

    def savepoint() -> dict[str, Any]:
        path = JobsView.client(request.match_info["job"]).savepoint(body["path"])
        return {"message": f"savepoint written to {path}"}
    return await _answer(savepoint)


async def _stop(request: web.Request) -> web.Response:
    body = await _body(request)

    def stop() -> dict[str, Any]:
        result = JobsView.client(request.match_info["job"]).stop_with_savepoint(
            body["path"], drain=bool(body.get("drain")))
        return {"message": f"{result.status}, savepoint written to {body['path']}"}
    return await _answer(stop)


async def _cancel(request: web.Request) -> web.Response:
    def cancel() -> dict[str, Any]:
        client = JobsView.client(request.match_info["job"])
        client.cancel()
        return {"message": f"{client.wait().status}"}
    return await _answer(cancel)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body must be JSON") from None
    if not isinstance(body, dict) or "path" in body and not str(body["path"]).strip():
        raise web.HTTPBadRequest(text="give a savepoint path (a directory or URI)")
    return body


async def _answer(call: Any, *args: Any) -> web.Response:
    """Run a blocking call on a thread; its error is the answer's ``error`` for the page
    to show: 404 for no such job, 409 for a call that failed (a savepoint, say)."""
    try:
        return web.json_response(await asyncio.to_thread(call, *args), dumps=_dumps)
    except KeyError as exc:
        return web.json_response({"error": f"missing field {exc}"}, status=400)
    except JobNotFoundError as exc:
        return web.json_response({"error": str(exc)}, status=404)
    except Exception as exc:
        return web.json_response({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                                  if str(exc) else type(exc).__name__}, status=409)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, default=str)


def _start(app: web.Application, host: str, port: int, loop: asyncio.AbstractEventLoop,
           *, any_port_if_taken: bool = False) -> tuple[web.AppRunner, str]:
    """Start serving ``app`` on ``loop``; the runner and the URL (with the bound port)."""
    runner = web.AppRunner(app, handle_signals=False)
    loop.run_until_complete(runner.setup())
    try:
        site = web.TCPSite(runner, host, port)
        loop.run_until_complete(site.start())
    except OSError:
        if not any_port_if_taken:
            loop.run_until_complete(runner.cleanup())
            raise
        site = web.TCPSite(runner, host, 0)  # another driver's UI has the port: any free one
        loop.run_until_complete(site.start())
    # the server loop.create_server made (aiohttp types it as AbstractServer, without sockets)
    server = cast(asyncio.Server, site._server)
    bound = server.sockets[0].getsockname()[1]
    return runner, f"http://{host}:{bound}/"


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          on_start: Callable[[str], None] = print) -> None:
    """Serve the UI until interrupted (``raystream ui``); Ray must be connected.
    ``on_start`` gets the URL once it serves (port 0: a free port)."""
    app = create_app(require_token=not is_loopback(host))
    loop = asyncio.new_event_loop()
    runner, url = _start(app, host, port, loop)
    on_start(url)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


_background: dict[str, str] = {}
_background_lock = threading.Lock()


def start_in_background(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """Serve the UI from a daemon thread of this process (once); its URL. A port in use
    gives way to a free one."""
    with _background_lock:
        if "url" in _background:
            return _background["url"]
        app = create_app(require_token=not is_loopback(host))
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                _, _background["url"] = _start(app, host, port, loop, any_port_if_taken=True)
            except BaseException as exc:
                failure.append(exc)
                return
            finally:
                started.set()
            loop.run_forever()

        threading.Thread(target=run, name="raystream ui", daemon=True).start()
        started.wait()
        if failure:
            raise failure[0]
        return _background["url"]
