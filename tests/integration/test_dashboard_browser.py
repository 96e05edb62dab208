"""The dashboard in a real headless Chromium, against run directories written by real runs.

    .venv/bin/python -m pytest -q tests/integration/test_dashboard_browser.py

A tiny RL run (run_rl, random policy) writes metrics and trajectories; a group of scripted-policy sessions (real
harness, sandbox and grader: pipeline/scripted.py) adds transcripts with tool calls, a self-summary and an
anti-cheat flag. The server is `flywheel dashboard` in a child process; the page is driven by Playwright.
The window is 1,400 × 1,000 (metrics/dashboard/browser.py). Screenshots of the overview, the rollout table with a transcript,
a group and the rest land in $FLYWHEEL_SCREENSHOTS when set (docs/observability.md shows them), else in a pytest
temporary directory, printed at the end of the module.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from dashboard_fixtures import Base, make_bad_runs, make_wide_group_run
from playwright.sync_api import sync_playwright
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.metrics.dashboard.browser import DashboardProcess as Server
from flywheel.metrics.dashboard.browser import launch_chromium
from flywheel.metrics.dashboard.trainer_logprobs import trajectory_key
from flywheel.metrics.log import MetricsLog, read_metrics
from flywheel.metrics.report import write_report
from flywheel.orchestrator.loop import AdmittedLog

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS: list[Path] = []  # the directory screenshots go to (set by the `world` fixture)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    base = Base(root / "base")
    runs = root / "runs"
    tiny = runs / "tiny"
    base.run(tiny, "async", 3, evals=True)
    group = base.append_scripted_group(tiny, version=3)
    make_bad_runs(runs, tiny)
    wide = make_wide_group_run(runs, tiny, group)
    SHOTS[:] = [Path(os.environ.get("FLYWHEEL_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))]
    server = Server(runs)
    with sync_playwright() as pw:
        context, profile = launch_chromium(pw)
        yield {"base": base, "runs": runs, "tiny": tiny, "group": group, "server": server, "context": context,
               "wide": wide}
        context.close()
        shutil.rmtree(profile, ignore_errors=True)
    server.stop()
    print(f"\nscreenshots (1,400 x 1,000): {SHOTS[0]}")


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
    SHOTS[0].mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS[0] / f"{name}.png"))


def fmt(x: float) -> str:
    """rollouts.js's `fmt`: whole numbers as they are, others to 3 decimals."""
    return str(int(x)) if float(x).is_integer() else f"{x:.3f}"


def ema(ys: list[float], a: float) -> list[float]:
    """TensorBoard's smoothing, as charts.js draws it: an EMA divided by its weight (no pull towards 0)."""
    out, m = [], 0.0
    for n, y in enumerate(ys, 1):
        m = a * m + (1 - a) * y
        out.append(m / (1 - a ** n))
    return out


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
    # sections by prefix: the first ones open, the others closed and not drawn until opened
    sections = page.locator("details.chart-group").evaluate_all("els => els.map(e => [e.dataset.group, e.open])")
    assert sections[:5] == [["rollout", True], ["reward", True], ["trainer", True], ["staleness", True],
                            ["mismatch", True]]
    assert ["weights", False] in sections and not page.evaluate("state.charts.has('weights/bytes_mb')")
    page.click("details.chart-group[data-group='weights'] > summary")
    page.wait_for_function("state.charts.has('weights/bytes_mb')")
    page.wait_for_selector("body[data-charts='done']")
    # the held-out result is the first tile: pass@1 before -> after with the paired SE, as summary.json holds it
    summary = json.loads((world["tiny"] / "summary.json").read_text())
    first = page.locator("#tiles .tile").first
    assert first.get_attribute("data-key") == "heldout"
    assert first.locator(".value").text_content() == f"{fmt(summary['pass1_before'])} → {fmt(summary['pass1_after'])}"
    assert f"± {fmt(summary['pass1_gain_se'])} SE" in first.locator(".sub").text_content()
    # a finished run (its summary holds the RL result) is not "live"
    assert page.get_attribute("#live", "data-state") == "finished"
    assert "live" not in page.text_content("#live") and "finished" in page.text_content("#live")
    # reward and pass rate: one tile when they are the same series, else two tiles with their own labels
    same = [r["rollout/reward_all"] for r in records] == [r["rollout/pass_rate_all"] for r in records]
    tiles = page.locator('#tiles .tile[data-key^="rollout/"]').evaluate_all(
        "els => els.map(e => [e.dataset.key, e.querySelector('.label').textContent])")
    keys = [k for k, _ in tiles]
    assert ("rollout/pass_rate_all" in keys) is not same and "rollout/reward_all" in keys
    assert same is ("reward = pass rate" in dict(tiles)["rollout/reward_all"])
    # the learning rate (1e-5 here) has readable ticks: distinct labels in exponent form, not "0 0 0"
    assert records[-1]["lr"] < 1e-3
    lr_ticks = page.evaluate("state.charts.get('lr').axes[1]._values")
    assert len(set(lr_ticks)) == len(lr_ticks) > 1 and all("e-" in t for t in lr_ticks), lr_ticks
    assert all(float(t) == pytest.approx(v, rel=0.06) for t, v in zip(lr_ticks, page.evaluate(
        "state.charts.get('lr').axes[1]._splits"))), lr_ticks
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


def test_chart_search_smoothing_and_wall_time_axis(page, world):
    """The search box keeps only the charts whose name holds every word typed (their sections open); smoothing adds
    the EMA of each series beside the raw one; the x axis switches between trainer step and wall time."""
    records = read_metrics(world["tiny"] / "metrics.jsonl")
    keys = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float)) and k not in ("step", "time")})
    open_run(page, world, "tiny")
    page.wait_for_selector("body[data-charts='done']")
    assert page.text_content("#chart-count") == f"{len(keys)} metrics"
    page.fill("#chart-search", "mismatch k")
    wanted = [k for k in keys if all(w in k.lower() for w in ("mismatch", "k"))]
    visible = page.locator("#charts .chart:not([hidden])").evaluate_all("els => els.map(e => e.dataset.key)")
    assert visible == wanted and page.text_content("#chart-count") == f"{len(wanted)} of {len(keys)} metrics"
    shown = page.locator("details.chart-group:not([hidden])").evaluate_all("els => els.map(e => e.dataset.group)")
    assert shown == ["mismatch"]
    page.fill("#chart-search", "weights/")  # a closed section with a match opens and draws
    page.wait_for_function("state.charts.has('weights/bytes_mb')")
    page.fill("#chart-search", "")
    page.wait_for_selector("body[data-charts='done']")
    assert page.locator("#charts .chart:not([hidden])").count() == len(keys)
    key = "entropy"
    page.eval_on_selector("#smooth", "el => { el.value = '0.5'; el.dispatchEvent(new Event('input')); }")
    page.wait_for_function(f"state.charts.get('{key}') && state.charts.get('{key}').data.length === 3")
    xs, ys, smooth = page.evaluate(f"state.charts.get('{key}').data")
    assert ys == pytest.approx([r[key] for r in records]) and smooth == pytest.approx(ema(ys, 0.5))
    assert smooth != pytest.approx(ys)  # the series moves, so smoothing shows
    page.select_option("#x-axis", "time")
    page.wait_for_function(f"state.charts.get('{key}') && state.charts.get('{key}').data[0][0] !== 1")
    xs = page.evaluate(f"state.charts.get('{key}').data[0]")
    assert xs == pytest.approx([r["time/elapsed_s"] for r in records])
    assert all(t.endswith((" s", " min", " h")) for t in page.evaluate(f"state.charts.get('{key}').axes[0]._values"))
    shot(page, "overview-smoothed-wall-time")


def test_deep_links_write_and_restore_a_transcript_and_a_group(page, world):
    open_run(page, world, "tiny", "rollouts")
    page.wait_for_selector("tr.rollout-row")
    row = page.locator("tr.rollout-row").nth(3)
    rid = row.get_attribute("data-id")
    row.click()
    page.wait_for_selector(f".transcript[data-id='{rid}']")
    url = page.url
    assert url.endswith(f"#run=tiny&view=rollouts&rollout={rid}"), url
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector(f".transcript[data-id='{rid}']", timeout=20_000)
    assert page.evaluate("document.querySelector('#rollout-count').textContent").endswith("rollouts match")
    gid = world["group"][0].group_id
    page.locator("tr.rollout-row", has_text=world["group"][0].task_id).locator(".group-link").last.click()
    page.wait_for_selector(".group-view")
    assert page.evaluate("new URLSearchParams(location.hash.slice(1)).get('group')") == gid
    url = page.url
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector(".group-view", timeout=20_000)
    assert page.locator(".group-view .member").count() == len(world["group"])
    page.click("button.back")  # back to the list: the address loses the group, keeps the transcript
    page.wait_for_selector(".transcript")
    assert "group=" not in page.url and f"rollout={rid}" in page.url
    page.click("nav a[data-view=overview]")
    assert page.url.endswith("#run=tiny&view=overview")


def test_rollout_table_and_a_wide_group_fit_a_1400_px_window(page, world):
    """No column of the rollout table is cut off: the table fits its panel; all 8 rollouts of a group are on screen
    side by side in a grid that wraps, none beyond the panel's right edge."""
    assert page.viewport_size == {"width": 1400, "height": 1000}
    open_run(page, world, "tiny", "rollouts")
    page.wait_for_selector("tr.rollout-row")
    page.locator("tr.rollout-row").last.click()
    page.wait_for_selector(".transcript")
    panel = page.locator("#rollout-list").bounding_box()
    heads = page.locator("table.rollouts th").evaluate_all(
        "els => els.map(e => [e.textContent, e.getBoundingClientRect().right])")
    assert [h for h, _ in heads][-3:] == ["tokens", "flags", "group"]
    assert all(right <= panel["x"] + panel["width"] + 0.5 for _, right in heads), (heads, panel)
    assert page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#rollout-list'))")
    shot(page, "rollout-table")
    page.goto("about:blank")
    page.goto(f"{world['server'].url}#run=wide&view=rollouts&group={world['wide']}")
    page.wait_for_selector(".group-view .member", timeout=20_000)
    detail = page.locator("#rollout-detail").bounding_box()
    members = page.locator(".group-view .member").evaluate_all(
        "els => els.map(e => { const b = e.getBoundingClientRect(); return [b.left, b.right, b.top]; })")
    assert len(members) == 8
    assert all(detail["x"] - 0.5 <= left and right <= detail["x"] + detail["width"] + 0.5 for left, right, _ in members)
    assert all(top < 1000 for _, _, top in members)  # every member starts on screen
    assert len({round(top) for _, _, top in members}) == 2  # 8 in two rows of four
    shot(page, "group-wide")


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
    page.wait_for_selector("#live[data-state='live']", timeout=20_000)  # being written: live
    page.wait_for_function("document.querySelector('#live-step').textContent.startsWith('step 2 of 2')",
                           timeout=120_000)
    thread.join(timeout=120)
    assert not thread.is_alive()
    page.wait_for_selector("#live[data-state='finished']", timeout=20_000)  # its summary.json came: finished
    assert "live" not in page.text_content("#live")
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
