"""The dashboard in a real headless Chromium, against run directories written by real runs.

    .venv/bin/python -m pytest -q tests/integration/test_dashboard_browser.py

A tiny RL run (run_rl, random policy) writes metrics and trajectories; a group of scripted-policy sessions (real
harness, sandbox and grader: bench/sessions.py) adds transcripts with tool calls, a self-summary and an
anti-cheat flag. The server is `flywheel dashboard` in a child process; the page is driven by Playwright.
Screenshots land in $FLYWHEEL_SCREENSHOTS when set (docs/observability.md shows them).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from dashboard_fixtures import Base, make_bad_runs
from playwright.sync_api import sync_playwright
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.bench.browser import DashboardProcess as Server
from flywheel.bench.browser import launch_chromium
from flywheel.metrics.dashboard.trainer_logprobs import trajectory_key
from flywheel.metrics.log import MetricsLog, read_metrics
from flywheel.metrics.report import write_report
from flywheel.orchestrator.loop import AdmittedLog

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS = os.environ.get("FLYWHEEL_SCREENSHOTS")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    base = Base(root / "base")
    runs = root / "runs"
    tiny = runs / "tiny"
    base.run(tiny, "async", 3, evals=True)
    group = base.append_scripted_group(tiny, version=3)
    make_bad_runs(runs, tiny)
    server = Server(runs)
    with sync_playwright() as pw:
        context, profile = launch_chromium(pw)
        yield {"base": base, "runs": runs, "tiny": tiny, "group": group, "server": server, "context": context}
        context.close()
        shutil.rmtree(profile, ignore_errors=True)
    server.stop()


@pytest.fixture
def page(world):
    page = world["context"].new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    page.close()
    assert not errors, f"the page raised: {errors}"
    assert world["server"].proc.poll() is None, f"the server died: {world['server'].output()}"


def open_run(page, world, run: str, view: str = "overview"):
    page.goto("about:blank")  # a fresh load (a change of the fragment alone would not reload the page)
    page.goto(f"{world['server'].url}#run={run}&view={view}")
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def blue_pixels(page, key: str) -> int:
    """Pixels of the series colour (#1f77b4) on the chart of `key`: the line was drawn."""
    return page.evaluate("""key => {
        const c = document.querySelector(`.chart[data-key="${key}"] canvas`);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] === 31 && d[i + 1] === 119 && d[i + 2] === 180) n++;
        return n; }""", key)


def test_overview_charts_and_tiles_show_the_runs_metrics(page, world):
    records = read_metrics(world["tiny"] / "metrics.jsonl")
    open_run(page, world, "tiny")
    page.wait_for_selector("body[data-charts='done']")
    shot(page, "overview")
    for key in ("loss", "rollout/reward_all", "staleness/mean", "weights/bytes_mb", "mismatch/k3"):
        xs, ys = page.evaluate("k => state.charts.get(k).data", key)
        assert xs == [r["step"] for r in records] and ys == pytest.approx([r[key] for r in records]), key
        assert blue_pixels(page, key) > 20, f"the chart of {key} drew no line"
    busy = page.text_content('.tile[data-key="trainer/busy"] .value')
    assert busy == f"{records[-1]['trainer/busy']:.3f}"
    assert page.text_content("#live-step").startswith("step 3 of 3")
    assert page.is_visible("#banner") is False
    rows = [t for _, g in AdmittedLog(world["tiny"] / "trajectories" / "admitted.jsonl").read() for t in g]
    unsubmitted = 100 * sum(not t.meta.get("submitted") for t in rows) / len(rows)
    assert page.text_content('.tile[data-key="unsubmitted_rate"] .value') == f"{unsubmitted:.1f} %"
    # policy entropy from the trainer, sandbox start-up, failures and leaks from the nodes: each a tile
    for key in ("entropy", "sandbox/startup_ms_p50", "sandbox/failures", "sandbox/leaks"):
        v = records[-1][key]
        text = str(int(v)) if v == int(v) else f"{v:.{0 if abs(v) >= 100 else 3}f}"
        assert page.text_content(f'.tile[data-key="{key}"] .value').startswith(text), key
    assert records[-1]["entropy"] > 0 and records[-1]["sandbox/startup_ms_p50"] > 0
    assert records[-1]["sandbox/failures"] == 0 and records[-1]["sandbox/leaks"] == 0
    # the task buckets come from the rollouts: the scripted group's bucket is listed
    assert world["group"][0].meta["mutation"] in page.text_content("#buckets")


def test_a_rollout_opens_with_its_tool_calls_verdicts_and_summary_mark(page, world):
    open_run(page, world, "tiny", "rollouts")
    fix = next(t for t in world["group"] if t.meta["script"] == "fix")
    page.fill("#filters input[name=task]", fix.task_id)
    page.fill("#filters input[name=min_reward]", "1")
    page.click("#filters button")
    page.wait_for_function("document.querySelector('#rollout-count').textContent.startsWith('2 rollouts')")
    solved = [t for t in world["group"] if t.reward.value >= 1]
    assert page.locator("tr.rollout-row").count() == len(solved) == 2
    page.locator("tr.rollout-row").first.click()
    page.wait_for_selector(".transcript")
    calls = page.locator(".transcript .tool-call b").all_text_contents()
    assert calls[-2:] == ["str_replace", "submit"] and "view" in calls
    passed = sum(v == "passed" for v in fix.reward.tests.values())
    assert f"hidden tests {passed}/{len(fix.reward.tests)} passed" in page.text_content(".verdict")
    assert page.locator(".transcript tr.test.passed").count() == passed
    assert page.locator(".turn.tool").count() >= 2  # tool outputs are shown
    (path, solved), = world["base"].tasks[0].solution.items()
    diff = page.text_content(".transcript pre.diff")
    assert diff.startswith(f"--- a/{path}\n+++ b/{path}")
    assert "replayed from the session's edit calls on the task's files" in page.text_content(".transcript")
    page.select_option(".colour-mode", "logprob")
    assert page.locator("pre.tokens span[title^='log p']").count() > 50
    shot(page, "rollout")
    page.locator("tr.rollout-row").nth(1).click()  # the session that summarized its work mid-way
    page.wait_for_selector(".segment-mark")
    assert "self-summary" in page.text_content(".segment-mark")


def test_tokens_colour_by_train_inference_mismatch(page, world):
    """The run's trainer wrote its recomputed log-probs (trainer_logprobs.jsonl): a trained rollout's tokens are
    coloured by |Δ log p| (trainer − sampler), each token's Δ as written; the scripted group, which no trainer saw,
    offers no such colouring."""
    tiny = world["tiny"]
    trajs = [t for _, g in AdmittedLog(tiny / "trajectories" / "admitted.jsonl").read() for t in g]
    lines = (tiny / "trainer_logprobs.jsonl").read_text().splitlines()
    records = {r["key"]: r for r in map(json.loads, lines)}
    trained = [i for i, t in enumerate(trajs) if trajectory_key(t) in records]
    assert len(trained) == len(lines) >= 12  # 3 steps of 4 trajectories, every one written (batch <= 8)
    i = max(trained, key=lambda i: sum(sum(s.loss_mask) for s in trajs[i].segments))
    deltas = [d for seg in records[trajectory_key(trajs[i])]["dlogp"] for d in seg]
    assert len(deltas) == sum(sum(s.loss_mask) for s in trajs[i].segments) and None not in deltas
    assert max(map(abs, deltas)) > 0  # engine and trainer differ: numerics (last bits) and any staleness
    open_run(page, world, "tiny", "rollouts")
    page.locator(f"tr.rollout-row[data-id='{i}']").click()
    page.wait_for_selector(f".transcript[data-id='{i}']")
    page.select_option(".colour-mode", "mismatch")
    spans = page.locator("pre.tokens span[data-dlogp]")
    assert [float(x) for x in spans.evaluate_all("els => els.map(e => e.dataset.dlogp)")] == deltas
    colours = spans.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    by_size = sorted(zip(map(abs, deltas), colours))
    green = [int(c.split(",")[1]) for _, c in by_size]  # rgb(r, g, b): the larger |Δ|, the less green
    assert green == sorted(green, reverse=True) and green[0] > green[-1]
    assert "recomputed at trainer step" in page.text_content(".transcript .hint")
    shot(page, "rollout-mismatch")
    scripted = len(trajs) - len(world["group"])  # the scripted group was appended last
    page.locator(f"tr.rollout-row[data-id='{scripted}']").click()
    page.wait_for_selector(f".transcript[data-id='{scripted}']")
    assert page.locator(".colour-mode option[value=mismatch]").count() == 0
    assert "no trainer log-probs for this rollout" in page.text_content(".transcript .hint")


def test_filters_narrow_the_list(page, world):
    open_run(page, world, "tiny", "rollouts")
    total = world["server"].get("api/runs")
    tiny = next(r for r in total["runs"] if r["name"] == "tiny")
    page.wait_for_function(f"document.querySelector('#rollout-count').textContent.startsWith('{tiny['num_rollouts']} ')")
    page.select_option("#filters select[name=flag]", "tests_edited")
    page.click("#filters button")
    page.wait_for_function("document.querySelector('#rollout-count').textContent.startsWith('1 rollouts')")
    assert page.locator("tr.rollout-row .flag").all_text_contents() == ["tests_edited"]
    page.select_option("#filters select[name=flag]", "")
    page.fill("#filters input[name=max_reward]", "0")
    page.click("#filters button")
    expected = sum(t.reward is not None and t.reward.value <= 0
                   for _, group in AdmittedLog(world["tiny"] / "trajectories" / "admitted.jsonl").read() for t in group)
    page.wait_for_function(f"document.querySelector('#rollout-count').textContent.startsWith('{expected} rollouts')")


def test_a_group_shows_side_by_side(page, world):
    open_run(page, world, "tiny", "rollouts")
    page.fill("#filters input[name=task]", world["group"][0].task_id)
    page.fill("#filters input[name=min_reward]", "1")
    page.click("#filters button")
    page.wait_for_function("document.querySelector('#rollout-count').textContent.startsWith('2 rollouts')")
    page.locator("tr.rollout-row .group-link").first.click()
    page.wait_for_selector(".group-view")
    assert page.locator(".group-view .member").count() == len(world["group"])
    assert page.locator(".group-view .member .verdict .flag").all_text_contents() == ["tests_edited"]
    shot(page, "group")


def test_live_view_picks_up_steps_while_a_run_writes_them(page, world):
    """A second run starts while the page is open: the page learns of the run, then of each step as it is
    written; a step appended afterwards arrives by the event stream alone (no API request)."""
    open_run(page, world, "tiny")
    live = world["runs"] / "live"
    # the loop also sends sample transcripts to a tracker: TensorBoard (tests/unit/test_trackers.py covers all three)
    thread = threading.Thread(target=world["base"].run, daemon=True, args=(
        live, "sync", 2, "--metrics.tensorboard", "true", "--metrics.transcripts_every", "1"))
    thread.start()
    page.wait_for_selector("#run-select option:text-is('live')", state="attached", timeout=60_000)
    page.select_option("#run-select", "live")
    page.wait_for_function("document.querySelector('#live-step').textContent.startsWith('step 2 of 2')",
                           timeout=120_000)
    thread.join(timeout=120)
    assert not thread.is_alive()
    events = EventAccumulator(str(live / "events"))
    events.Reload()
    assert {"transcripts/best/text_summary", "transcripts/worst/text_summary"} <= set(events.Tags()["tensors"])
    assert [e.step for e in events.Tensors("transcripts/best/text_summary")] == [1, 2]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    last = read_metrics(live / "metrics.jsonl")[-1]
    log = MetricsLog(live)
    log.write({**last, "step": 3, "rollout/reward_all": 0.625, "time": last["time"] + 1})
    log.close()
    page.wait_for_function("document.querySelector('#live-step').textContent.startsWith('step 3 of 2')")
    page.wait_for_selector("body[data-charts='done']")
    assert page.text_content('.tile[data-key="rollout/reward_all"] .value') == "0.625"
    assert page.evaluate("state.charts.get('loss').data[0]") == [1, 2, 3]
    assert not [u for u in requests if "/api/" in u], f"the update was fetched, not pushed: {requests}"
    shot(page, "live")


def test_compare_overlays_runs_and_shows_heldout_before_after(page, world):
    open_run(page, world, "tiny")
    page.click("nav a[data-view=compare]")
    page.wait_for_selector("#compare-chart canvas")
    runs = page.locator("#compare-runs input").evaluate_all("els => els.map(e => e.value)")
    assert "tiny" in runs
    table = page.text_content("#compare-evals")
    assert "before" in table and "after" in table and "easy" in table
    shot(page, "compare")


def test_bad_input_is_reported_and_the_server_keeps_serving(page, world):
    open_run(page, world, "corrupt-metrics")
    banner = page.text_content("#banner")
    assert "line 2 is not valid JSON" in banner and "JSON list, not an object" in banner
    records = read_metrics(world["tiny"] / "metrics.jsonl")
    page.wait_for_selector("body[data-charts='done']")
    assert page.evaluate("state.charts.get('loss').data[0]") == [r["step"] for r in records]
    shot(page, "bad-input")
    open_run(page, world, "half-written")
    assert "no metrics.jsonl yet" in page.text_content("#banner")
    page.click("nav a[data-view=rollouts]")
    page.wait_for_function("document.querySelector('#rollout-count').textContent.startsWith('0 rollouts')")
    page.goto(f"{world['server'].url}api/run/nope")
    assert "no run named 'nope'" in page.text_content("body")
    page.goto(f"{world['server'].url}api/run/tiny/rollout/999999")
    assert "rollout '999999'" in page.text_content("body")


def test_an_empty_runs_directory_says_so(world, tmp_path):
    server = Server(tmp_path)
    page = world["context"].new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector("body[data-ready='1']")
        assert "no run directories under" in page.text_content("#banner")
        assert server.proc.poll() is None
    finally:
        page.close()
        server.stop()


def test_the_static_report_browses_a_sample_of_transcripts_offline(page, world):
    html_path = write_report(world["tiny"])
    text = html_path.read_text()
    assert "http://" not in text and "https://" not in text  # one file, nothing fetched
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(html_path.as_uri())
    scripted = page.locator("tr.rollout-row", has_text=world["group"][0].task_id)
    assert scripted.count() >= len(world["group"])  # the last group is always in the sample
    page.locator("tr.rollout-row").first.click()
    page.wait_for_selector(".transcript .verdict")
    page.locator("tr.rollout-row .group-link").last.click()
    page.wait_for_selector(".group-view")
    assert page.locator(".group-view .member").count() == len(world["group"])
    assert "tests_edited" in page.text_content(".group-view")
    assert all(u.startswith("file://") or u.startswith("data:") for u in requests), requests
    shot(page, "report")
