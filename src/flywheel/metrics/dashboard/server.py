"""The dashboard's web server: a read-only JSON API over run directories, server-sent events, static pages.

    flywheel dashboard runs/                     # http://127.0.0.1:8765, every run under runs/
    flywheel dashboard runs/demo --port 9000     # one run
    flywheel dashboard runs/ --host 0.0.0.0 --token SECRET   # elsewhere than loopback: a token is required

    app = build_app(Dashboard(Path("runs"), open_event_log=opener))   # from code (tests, the benchmark)

An online run's event log is read through `open_event_log` (online.py's EventSourceOpener): the dashboard sits
below online/ in the layers, so commands/dashboard.py builds the reader from online/events.py and hands it in.

Why so: aiohttp is already a dependency and serves both the API and the event stream from one asyncio loop.
One poller reads what every run appended (runindex.py reads only new bytes; online.py only new rows of an online
run's event log) and pushes it to each open page as an SSE `update` event, so a page never re-downloads what it
has and a hundred pages cost one poller; for an online run the event says the log grew and the page fetches
`/api/run/<name>/online`, a view of bounded size. The server only reads: there is no route that writes, and
every request needs the token when one is set (query `?token=`, which also sets a cookie, or `Authorization:
Bearer`). An exception in a handler becomes a JSON error naming the run and what failed; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from flywheel.metrics.dashboard.diff import RunTasks, replay_diff
from flywheel.metrics.dashboard.online import EventSourceOpener
from flywheel.metrics.dashboard.runindex import RunIndex, discover_runs
from flywheel.metrics.dashboard.trainer_logprobs import TrainerLogprobs, trajectory_key
from flywheel.metrics.dashboard.transcript import TokenDecoder, group_view, run_tools, transcript_view

STATIC = Path(__file__).with_name("static")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_PAGE = 500  # rollout rows per request
_FILTERS = {"task": str, "group": str, "bucket": str, "flag": str, "min_reward": float, "max_reward": float,
            "min_version": int, "max_version": int, "min_tokens": int, "max_tokens": int}
_POLLER = web.AppKey("poller", asyncio.Task)
_SORTS = ("id", "reward", "version", "sampled_tokens", "turns", "tokens")


def _finite(obj: Any) -> Any:
    """JSON has no NaN/Infinity: they become null (metrics.jsonl may hold them from an older writer)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(_finite(data)), status=status, content_type="application/json")


class Dashboard:
    """The runs under one directory, polled for what they append; subscribers get each change."""

    def __init__(self, root: Path, poll_s: float = 1.0, online_window: int = 32,
                 open_event_log: EventSourceOpener | None = None, online_runs: frozenset[str] = frozenset()):
        """`open_event_log` finds an online run's event log (None: no Online view); `online_runs` names runs
        listed even when their directory shows no sign of a run (an event log on a database server)."""
        self.root = Path(root)
        self.poll_s = poll_s
        self.online_window = online_window
        self.open_event_log = open_event_log
        self.online_runs = online_runs
        self.runs: dict[str, RunIndex] = {}
        self.decoders: dict[str, TokenDecoder | None] = {}
        self.tasks: dict[str, RunTasks] = {}
        self.trainer_logprobs: dict[str, TrainerLogprobs] = {}
        self.subscribers: set[asyncio.Queue] = set()
        self._lock = threading.Lock()  # one poll at a time; handlers read what a finished poll left
        self.refresh()

    def refresh(self) -> list[dict[str, Any]]:
        """Discover runs, read what each appended; returns one event per run that changed."""
        events = []
        with self._lock:
            for path in discover_runs(self.root, self.online_runs):
                name = path.name if path != self.root else self.root.name
                if name not in self.runs:
                    self.runs[name] = RunIndex(path, self.online_window, self.open_event_log)
                    events.append({"run": name, "new_run": True})
                    continue
                run = self.runs[name]
                before = len(run.metrics.records)
                was = run.state()["state"]
                changed = run.poll()
                if any(changed.values()) or run.state()["state"] != was:  # a run that stops writes nothing: say so
                    events.append({"run": name, "first": before, "records": run.metrics.records[before:],
                                   "num_rollouts": len(run.trajectories.rows), "notes": run.status(),
                                   "state": run.state(),
                                   "files_changed": bool(changed["files"]), "online": bool(changed["online"])})
        return events

    def run(self, name: str) -> RunIndex:
        if name not in self.runs:
            raise web.HTTPNotFound(text=json.dumps({"error": f"no run named {name!r} under {self.root}"}),
                                   content_type="application/json")
        return self.runs[name]

    def tools(self, name: str) -> dict[str, dict]:
        """The tools the run's sessions had (its config's env.tools)."""
        return run_tools(self.run(name).config)

    def decoder(self, name: str) -> TokenDecoder | None:
        if name not in self.decoders or self.decoders[name] is None:
            run = self.run(name)
            self.decoders[name] = TokenDecoder.for_run(run.path, run.config)
        return self.decoders[name]

    def trainer_record(self, name: str, traj) -> dict[str, Any] | None:
        """The trainer's recomputed log-probs of `traj` (trainer_logprobs.jsonl), if it wrote them."""
        index = self.trainer_logprobs.get(name)
        if index is None:
            index = self.trainer_logprobs[name] = TrainerLogprobs(self.run(name).path)
        index.poll()
        return index.get(trajectory_key(traj))

    def final_diff(self, name: str, task_id: str, view: dict[str, Any]) -> dict[str, Any]:
        """The session's final diff: recorded in the trajectory, else replayed on the run's task (diff.py)."""
        if view.get("diff") is not None:
            return {"diff": view["diff"], "exact": True, "note": "recorded by the session"}
        if name not in self.tasks:
            run = self.run(name)
            self.tasks[name] = RunTasks(run.path, run.config)
        return replay_diff(self.tasks[name].get(task_id), view)

    async def poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                events = await asyncio.to_thread(self.refresh)
            except Exception as err:  # a run dir vanishing mid-read and the like: report, keep polling
                events = [{"run": "", "notes": [f"reading the runs failed: {err}"]}]
            for event in events:
                for q in list(self.subscribers):
                    q.put_nowait(event)


def run_overview(run: RunIndex) -> dict[str, Any]:
    records = run.metrics.records
    steps = [r["step"] for r in records if isinstance(r.get("step"), (int, float))]
    return {"name": run.name, "num_records": len(records), "last_step": max(steps) if steps else None,
            "num_rollouts": len(run.trajectories.rows), "notes": run.status(), "online": run.online is not None,
            "state": run.state(),
            "num_steps": trainer.get("num_steps") if isinstance(trainer := run.config.get("trainer"), dict) else None}


def _evals_by_kind(run: RunIndex) -> dict[str, Any]:
    """Held-out pass@1 per task kind (difficulty), for each evaluation (before, after)."""
    out: dict[str, Any] = {}
    for name, rows in run.evals().items():
        kinds: dict[str, list[float]] = {}
        for r in rows:
            if r.get("n"):
                kinds.setdefault(str(r.get("difficulty") or "all"), []).append(r["correct"] / r["n"])
                if r.get("difficulty"):
                    kinds.setdefault("all", []).append(r["correct"] / r["n"])
        out[name] = {k: {"pass1": sum(v) / len(v), "num_tasks": len(v)} for k, v in sorted(kinds.items())}
    return out


def heldout(run: RunIndex) -> dict[str, Any] | None:
    """Held-out pass@1 before and after RL, with the paired SE of the gain when the job computed it: from
    summary.json (the job's figures), else from the evaluation files (eval_before/after.jsonl) as they appear."""
    s = run.summary
    out: dict[str, Any] = {}
    if isinstance(s.get("pass1_before"), (int, float)):
        out = {k: s.get(k) for k in ("pass1_before", "pass1_after", "pass1_gain", "pass1_gain_se")}
        out["source"] = "summary.json"
    else:
        evals = _evals_by_kind(run)
        for name in ("before", "after"):
            if "all" in evals.get(name, {}):
                out[f"pass1_{name}"] = evals[name]["all"]["pass1"]
                out["num_tasks"] = evals[name]["all"]["num_tasks"]
        if out:
            out["source"] = "eval_*.jsonl"
    if isinstance(out.get("pass1_before"), (int, float)) and isinstance(out.get("pass1_after"), (int, float)):
        out["pass1_gain"] = out["pass1_after"] - out["pass1_before"]
    return out or None


def _max_turns(run: RunIndex) -> int | None:
    rollout = run.config.get("rollout")
    return rollout.get("max_turns") if isinstance(rollout, dict) else None


def build_app(dash: Dashboard, token: str | None = None) -> web.Application:
    """The aiohttp application: GET routes only; a token, when given, guards every one."""

    @web.middleware
    async def guard(request: web.Request, handler):
        if token:
            given = request.query.get("token") or request.cookies.get("flywheel_token") or \
                request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not given or not hmac.compare_digest(given, token):
                return web.Response(status=401, text="flywheel dashboard: this server needs its token; open the "
                                                     "URL it printed (…/?token=…)")
        try:
            resp = await handler(request)
        except web.HTTPException:
            raise
        except Exception as err:  # a broken file must not take the server down: say what failed
            return _json({"error": f"{type(err).__name__}: {err}", "path": request.path}, status=500)
        if token and request.query.get("token") and isinstance(resp, web.Response):
            resp.set_cookie("flywheel_token", token, httponly=True, samesite="Strict")
        return resp

    async def index(request):
        return web.FileResponse(STATIC / "index.html")

    async def favicon(request):
        return web.Response(status=204)

    async def runs(request):
        return _json({"root": str(dash.root), "runs": [run_overview(r) for r in dash.runs.values()]})

    detail_cache: dict[str, tuple[tuple[int, str], str]] = {}  # run -> (generation, body): every open page asks for it

    async def run_detail(request):
        run = dash.run(request.match_info["name"])
        cached = detail_cache.get(run.name)
        state = run.state()["state"]
        if cached is None or cached[0] != (run.generation, state):
            body = json.dumps(_finite({**run_overview(run), "config": run.config, "summary": run.summary,
                                       "heldout": heldout(run),
                                       "records": run.metrics.records, "facets": run.trajectories.facets(),
                                       "buckets": run.trajectories.buckets(), "evals": _evals_by_kind(run),
                                       "health": run.trajectories.health(_max_turns(run))}))
            cached = detail_cache[run.name] = ((run.generation, state), body)
        return web.Response(text=cached[1], content_type="application/json")

    async def rollouts(request):
        run = dash.run(request.match_info["name"])
        q = request.query
        filters: dict[str, Any] = {}
        for key, kind in _FILTERS.items():
            if q.get(key, "") != "":
                try:
                    filters[key] = kind(q[key])
                except ValueError:
                    return _json({"error": f"filter {key}={q[key]!r} is not a {kind.__name__}"}, status=400)
        rows = run.trajectories.select(**filters)
        sort = q.get("sort", "id")
        if sort.lstrip("-") not in _SORTS:
            return _json({"error": f"sort must be one of {', '.join(_SORTS)} (prefix - for descending)"}, 400)
        if sort != "id":
            key = sort.lstrip("-")
            rows = sorted(rows, key=lambda r: (r[key] is None, r[key] if r[key] is not None else 0),
                          reverse=sort.startswith("-"))
        try:
            offset, limit = max(0, int(q.get("offset", 0))), min(MAX_PAGE, max(1, int(q.get("limit", 100))))
        except ValueError:
            return _json({"error": "offset and limit must be integers"}, status=400)
        return _json({"total": len(rows), "offset": offset, "rows": rows[offset:offset + limit]})

    async def rollout(request):
        name = request.match_info["name"]
        run = dash.run(name)
        try:
            traj_id = int(request.match_info["id"])
            traj = await asyncio.to_thread(run.trajectories.load, traj_id)
        except (KeyError, ValueError) as err:
            return _json({"error": f"rollout {request.match_info['id']!r} of run {name!r}: {err}"}, status=404)
        trainer = await asyncio.to_thread(dash.trainer_record, name, traj)
        view = transcript_view(traj, dash.decoder(name), trainer, dash.tools(name))
        diff = await asyncio.to_thread(dash.final_diff, name, traj.task_id, view)
        return _json({"id": traj_id, **view, "diff": diff["diff"], "diff_note": diff["note"],
                      "row": run.trajectories.rows[traj_id]})

    async def group(request):
        name = request.match_info["name"]
        run = dash.run(name)
        gid = request.query.get("id", "")
        ids = run.trajectories.groups.get(gid)
        if not ids:
            return _json({"error": f"run {name!r} has no group {gid!r}"}, status=404)
        trajs = await asyncio.to_thread(lambda: [(i, run.trajectories.load(i)) for i in ids])
        return _json({"group": gid, "members": group_view(trajs, dash.decoder(name), dash.tools(name))})

    async def online(request):
        run = dash.run(request.match_info["name"])
        if run.online is None:
            return _json({"error": f"run {run.name!r} has no online event log ({run.path}/online.db, written by "
                                   "`flywheel serve`)"}, status=404)
        return _json(run.online.view())

    async def events(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        dash.subscribers.add(queue)
        try:
            await resp.write(b": connected\n\n")
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=15.0)
                    if event is None:  # the server is shutting down
                        break
                    await resp.write(f"event: update\ndata: {json.dumps(_finite(event))}\n\n".encode())
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            dash.subscribers.discard(queue)
        return resp

    async def start_poller(app):
        app[_POLLER] = asyncio.create_task(dash.poll_forever())

    async def stop_poller(app):
        app[_POLLER].cancel()

    async def end_streams(app):
        """Close open event streams at shutdown; else a page's stream holds the exit for aiohttp's 60 s timeout."""
        for q in list(dash.subscribers):
            q.put_nowait(None)

    app = web.Application(middlewares=[guard])
    app.add_routes([web.get("/", index), web.get("/api/runs", runs), web.get("/api/run/{name}", run_detail),
                    web.get("/api/run/{name}/rollouts", rollouts), web.get("/api/run/{name}/rollout/{id}", rollout),
                    web.get("/api/run/{name}/group", group), web.get("/api/run/{name}/online", online),
                    web.get("/api/events", events),
                    web.get("/favicon.ico", favicon)])
    app.router.add_static("/static/", STATIC)
    app.on_startup.append(start_poller)
    app.on_shutdown.append(end_streams)
    app.on_cleanup.append(stop_poller)
    return app


def check_binding(host: str, token: str | None) -> None:
    """Loopback is open to local users only; any other address must be guarded by a token."""
    if host not in LOOPBACK and not token:
        raise ValueError(f"binding the dashboard to {host!r} exposes every transcript of every run: pass "
                         "--token SECRET (or bind to 127.0.0.1 and use an SSH tunnel)")


def serve(root: Path, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          poll_s: float = 1.0, print_fn=print, online_window: int = 32, open_event_log: EventSourceOpener | None = None,
          online_runs: frozenset[str] = frozenset()) -> None:
    """Index the runs under `root` and serve until interrupted."""
    check_binding(host, token)
    dash = Dashboard(root, poll_s, online_window, open_event_log, online_runs)
    url = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    print_fn(f"flywheel dashboard: {len(dash.runs)} run(s) under {root}; open {url}")
    web.run_app(build_app(dash, token), host=host, port=port, print=None)
