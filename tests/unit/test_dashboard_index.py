"""The dashboard's run index and server: partial and corrupt files, trajectories read by offset, the token.

    .venv/bin/python -m pytest -q tests/unit/test_dashboard_index.py
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flywheel.config import EnvConfig
from flywheel.envs.tools import tools_for
from flywheel.metrics.dashboard.diff import RunTasks, replay_diff
from flywheel.metrics.dashboard.runindex import (
    JsonlTail,
    MetricsFile,
    RunIndex,
    TrajectoryFiles,
    _fast_summaries,
    discover_runs,
    full_summaries,
)
from flywheel.metrics.dashboard.server import Dashboard, build_app, check_binding
from flywheel.metrics.dashboard.trainer_logprobs import (
    TrainerLogprobs,
    TrainerLogprobsWriter,
    sample_indices,
    trajectory_key,
)
from flywheel.metrics.dashboard.transcript import TokenDecoder, transcript_view
from flywheel.orchestrator.loop import AdmittedLog
from flywheel.pipeline.scripted import scripted_group
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.tasks.loaders import save_tasks
from flywheel.tasks.synth import generate_tasks

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(default_corpus(200_000), 512)


@pytest.fixture(scope="module")
def group(tok, tmp_path_factory):
    task = generate_tasks(1, seed=3, split="train", difficulty="easy")[0]
    return scripted_group(ChatFormat(tok, tools_for(ENV)), task, ENV, tmp_path_factory.mktemp("cache"), version=4, seed=1)


def test_the_fast_summary_equals_a_full_parse(group):
    line = json.dumps({"index": 0, "group": [t.to_dict() for t in group]}).encode()
    assert _fast_summaries(line) == full_summaries(line)
    fast = _fast_summaries(line)
    assert [d["_version"] for d in fast] == [t.min_version for t in group] == [4] * len(group)
    assert [d["_num_tokens"] for d in fast] == [sum(len(s.token_ids) for s in t.segments) for t in group]
    assert sorted(d["_num_segments"] for d in fast) == [1, 1, 1, 1, 2]


def test_a_meta_string_that_looks_like_keys_does_not_fool_the_index(group, tmp_path):
    """Strings holding `"reward": ` or the next trajectory's opening are escaped in JSON; a nested dict with
    `task_id` breaks the fast path's assumption, and the full parse takes over with the same result."""
    a, b = (t.to_dict() for t in group[:2])
    a["meta"]["note"] = '"reward": {"value": 9}, }, {"task_id": "x", "segments": ['
    b["meta"]["nested"] = [{"task_id": "inner", "reward": 5}]
    path = tmp_path / "trajectories" / "t.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"index": 0, "group": [a, b]}) + "\n")
    files = TrajectoryFiles(path.parent)
    assert files.poll() == 2
    assert [r["reward"] for r in files.rows] == [a["reward"]["value"], b["reward"]["value"]]
    assert files.load(1).meta["nested"] == [{"task_id": "inner", "reward": 5}]


def test_trajectories_load_by_offset_exactly_and_filters_select(group, tmp_path):
    log = AdmittedLog(tmp_path / "trajectories" / "admitted.jsonl")
    log.append(group)
    log.append(group[:2])
    log.close()
    files = TrajectoryFiles(tmp_path / "trajectories", bucket_key="mutation")
    assert files.poll() == len(group) + 2
    for i, t in enumerate(group + group[:2]):
        assert files.load(i).to_dict() == t.to_dict()
    assert [r["id"] for r in files.select(flag="tests_edited")] == \
        [i for i, t in enumerate(group + group[:2]) if "tests_edited" in t.reward.flags]
    assert len(files.select(min_reward=1.0)) == 2 * sum(t.reward.value >= 1 for t in group[:2]) + \
        sum(t.reward.value >= 1 for t in group[2:])
    assert files.select(task="no-such-task") == []
    assert len(files.groups[group[0].group_id]) == len(group) + 2
    with pytest.raises(KeyError, match="no trajectory 99"):
        files.load(99)


def test_a_torn_last_line_waits_and_a_corrupt_line_is_reported(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\nnot json\n[1]\n{"step": 2, "lo')
    m = MetricsFile(path)
    assert m.poll() == 1 and m.tail.pending == len('{"step": 2, "lo')
    messages = [p.message for p in m.tail.problems]
    assert messages[0].startswith("line 2 is not valid JSON") and "line 3 is a JSON list" in messages[1]
    with path.open("a") as f:
        f.write('ss": 0.25}\n')  # the writer finishes the line
    assert m.poll() == 1 and m.records[-1] == {"step": 2, "loss": 0.25}
    path.write_text('{"step": 1}\n')  # replaced by a shorter file: read again from the start
    assert m.poll() == 1 and m.records[-1] == {"step": 1}


def test_a_tail_keeps_byte_offsets_of_multibyte_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": "é"}\n{"b": 2}\n', encoding="utf-8")
    lines = JsonlTail(path).read_new()
    assert [(n, off) for n, off, _ in lines] == [(1, 0), (2, len('{"a": "é"}\n'.encode()))]


def test_run_discovery_and_status_of_a_half_written_run(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 8}')  # a model dir is not a run
    (tmp_path / "r1" / "trajectories").mkdir(parents=True)
    (tmp_path / "r1" / "summary.json").write_text('{"pass1_bef')
    assert [p.name for p in discover_runs(tmp_path)] == ["r1"]
    notes = RunIndex(tmp_path / "r1").status()
    assert any("no metrics.jsonl yet" in n for n in notes)
    assert any(n.startswith("summary.json: cannot be read as JSON") for n in notes)


def test_a_transcript_rebuilds_turns_tool_calls_and_segments(group, tok):
    decoder = TokenDecoder(tok.backend_tokenizer)
    summary = next(t for t in group if t.meta["script"] == "fix_after_summary")
    view = transcript_view(summary, decoder)
    assert [s["after_summary"] for s in view["segments"]] == [False, True]
    calls = [c["name"] for s in view["segments"] for t in s["turns"] for c in t.get("tool_calls", [])]
    assert calls == ["view", "str_replace", "submit"]
    for seg, s in zip(summary.segments, view["segments"]):
        assert sum(t.get("num_sampled", 0) for t in s["turns"]) == sum(seg.loss_mask)
        assert "".join(decoder.texts(seg.token_ids)) == tok.decode(seg.token_ids, skip_special_tokens=False)
    malformed = transcript_view(next(t for t in group if t.meta["script"] == "malformed"), decoder)
    errors = [e["kind"] for s in malformed["segments"] for t in s["turns"] for e in t.get("tool_errors", [])]
    assert errors == ["malformed_json"]


def _serve(root, token, requests):
    async def go():
        client = TestClient(TestServer(build_app(Dashboard(root, poll_s=0.05), token)))
        await client.start_server()
        try:
            out = []
            for method, path, headers in requests:
                resp = await client.request(method, path, headers=headers or {})
                out.append((resp.status, await resp.text(), resp.cookies))
            return out
        finally:
            await client.close()
    return asyncio.run(go())


def test_a_token_guards_every_route_and_nothing_writes(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "metrics.jsonl").write_text('{"step": 1, "loss": NaN}\n')
    (none, _, _), (query, body, cookies), (bearer, _, _), (post, _, _) = _serve(tmp_path, "s3cret", [
        ("GET", "/api/runs", None), ("GET", "/api/run/r1?token=s3cret", None),
        ("GET", "/api/runs", {"Authorization": "Bearer s3cret"}),
        ("POST", "/api/runs", {"Authorization": "Bearer s3cret"})])
    assert none == 401 and query == 200 and bearer == 200 and post == 405
    assert json.loads(body)["records"] == [{"step": 1, "loss": None}]  # NaN is not JSON: it becomes null
    assert cookies["flywheel_token"].value == "s3cret"


def test_bad_requests_get_clear_errors(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "metrics.jsonl").write_text("")
    results = _serve(tmp_path, None, [("GET", "/api/run/r1/rollouts?min_reward=high", None),
                                      ("GET", "/api/run/r1/rollouts?sort=colour", None),
                                      ("GET", "/api/run/r2", None), ("GET", "/api/run/r1/rollout/x", None)])
    assert [r[0] for r in results] == [400, 400, 404, 404]
    assert "min_reward='high' is not a float" in results[0][1] and "no run named 'r2'" in results[2][1]


def test_binding_beyond_loopback_needs_a_token():
    check_binding("127.0.0.1", None)
    check_binding("0.0.0.0", "t")
    with pytest.raises(ValueError, match="--token"):
        check_binding("0.0.0.0", None)


def test_the_decoder_is_found_from_the_run_config(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "tk")
    assert TokenDecoder.for_run(tmp_path / "run", {"tokenizer": {"path": str(tmp_path / "tk")}}) is not None
    assert TokenDecoder.for_run(tmp_path / "run", {}) is None


def test_reading_in_small_chunks_gives_the_same_lines(tmp_path, monkeypatch):
    import flywheel.metrics.dashboard.runindex as runindex

    path = tmp_path / "t.jsonl"
    lines = [json.dumps({"i": i, "pad": "x" * (i * 7 % 23)}) for i in range(40)]
    path.write_text("\n".join(lines) + "\n" + '{"torn": ')
    monkeypatch.setattr(runindex, "CHUNK", 16)  # smaller than most lines
    tail = JsonlTail(path)
    got = list(tail.read_new())
    assert [json.loads(line) for _, _, line in got] == [json.loads(x) for x in lines]
    raw = path.read_bytes()
    assert all(raw[off:off + len(line)] == line for _, off, line in got)
    assert tail.pending == len('{"torn": ') and tail.offset == len(raw) - tail.pending


def test_health_counts_how_sessions_ended(group, tmp_path):
    log = AdmittedLog(tmp_path / "trajectories" / "admitted.jsonl")
    log.append(group)
    log.close()
    files = TrajectoryFiles(tmp_path / "trajectories")
    files.poll()
    health = files.health(max_turns=4)
    n = len(group)
    assert health["unsubmitted_rate"] == sum(not t.meta["submitted"] for t in group) / n
    assert health["tool_error_rate"] == sum(t.num_tool_errors > 0 for t in group) / n == 1 / n  # the malformed call
    assert health["max_turns_rate"] == sum(t.num_turns >= 4 for t in group) / n
    assert health["env_failure_rate"] == 0.0 and health["context_full_rate"] == 0.0


def test_the_final_diff_replays_the_edit_calls(group, tok, tmp_path):
    """The oracle's edits leave exactly the task's known solution; a malformed call changes nothing; the session
    that rewrote a test file shows that file; a task missing from the run says so."""
    import difflib

    decoder = TokenDecoder(tok.backend_tokenizer)
    task = generate_tasks(1, seed=3, split="train", difficulty="easy")[0]
    save_tasks([task], tmp_path / "tasks" / "train.jsonl")
    tasks = RunTasks(tmp_path, {})
    by_script = {t.meta["script"]: replay_diff(tasks.get(t.task_id), transcript_view(t, decoder)) for t in group}
    (path, solved), = task.solution.items()
    expected = "".join(difflib.unified_diff(task.files[path].splitlines(True), solved.splitlines(True),
                                            f"a/{path}", f"b/{path}"))
    assert by_script["fix"] == {"diff": expected, "exact": True, "note": by_script["fix"]["note"]}
    assert by_script["fix_after_summary"]["diff"] == expected  # the edit was in the first segment
    assert by_script["malformed"]["diff"] == ""
    assert "+def test_ok():" in by_script["edits_tests"]["diff"]
    assert replay_diff(tasks.get("no-such-task"), {"segments": []})["diff"] is None
    other = generate_tasks(1, seed=9, split="train", difficulty="easy")[0]
    save_tasks([other], tmp_path / "tasks" / "more.jsonl")  # written later: found on the next miss
    assert tasks.get(other.id).files == other.files


def test_trainer_logprobs_reach_the_transcript_by_content_key(group, tok, tmp_path):
    """The trainer's recomputed log-probs of a sample (trainer_logprobs.jsonl) are found by the transcript's
    content key and shown per token as Δ log p; a trajectory it wrote none for, or a broken line, shows none."""
    assert sample_indices(32, 8) == [0, 4, 9, 13, 18, 22, 27, 31] and sample_indices(3, -1) == [0, 1, 2]
    assert sample_indices(5, 0) == [] and sample_indices(5, 1) == [0] and sample_indices(2, 8) == [0, 1]
    fix = next(t for t in group if t.meta["script"] == "fix")
    other = next(t for t in group if t is not fix)
    assert trajectory_key(fix) != trajectory_key(other) and trajectory_key(fix) == trajectory_key(fix)
    # the trainer's log-prob = the sampler's + 0.25 on the first sampled token, + 3e-7 elsewhere, none off-mask
    first = fix.segments[0].loss_mask.index(1)
    lps = [[(s + (0.25 if i == first else 3e-7)) if m and i else None
            for i, (m, s) in enumerate(zip(seg.loss_mask, seg.logprobs))] for seg in fix.segments]
    log = AdmittedLog(tmp_path / "trajectories" / "admitted.jsonl")
    log.append(group)
    log.close()
    save_tokenizer(tok, tmp_path / "tokenizer")
    written = TrainerLogprobsWriter(tmp_path).write(3, [(fix, lps)])
    with (tmp_path / "trainer_logprobs.jsonl").open("a") as f:
        f.write("not json\n")
    assert 0 < written < 20 * sum(sum(s.loss_mask) for s in fix.segments) + 200  # small: Δ to 3 digits
    index = TrainerLogprobs(tmp_path)
    assert index.poll() == 1 and index.tail.problems[0].line == 2 and index.get(trajectory_key(other)) is None
    view = transcript_view(fix, TokenDecoder(tok.backend_tokenizer), index.get(trajectory_key(fix)))
    assert view["trainer_step"] == 3
    toks = [t for s in view["segments"] for turn in s["turns"] for t in turn.get("tokens", []) if t[1] is not None]
    assert len(toks) == sum(sum(s.loss_mask) for s in fix.segments)
    assert toks[0][3] == 0.25 and {t[3] for t in toks[1:]} == {3e-7}
    assert max(turn.get("max_abs_dlogp", 0) for s in view["segments"] for turn in s["turns"]) == 0.25
    # through the server: the rollout API carries them; a rollout without them has three entries per token
    ids = {t.meta["script"]: i for i, t in enumerate(group)}
    (ok, body, _), (ok2, body2, _) = _serve(tmp_path.parent, None, [
        ("GET", f"/api/run/{tmp_path.name}/rollout/{ids['fix']}", None),
        ("GET", f"/api/run/{tmp_path.name}/rollout/{ids[other.meta['script']]}", None)])
    assert ok == ok2 == 200
    api_toks = [t for s in json.loads(body)["segments"] for turn in s["turns"] for t in turn.get("tokens", [])
                if t[1] is not None]
    assert [t[3] for t in api_toks] == [t[3] for t in toks]
    assert json.loads(body2)["trainer_step"] is None
    assert all(len(t) == 3 for s in json.loads(body2)["segments"] for turn in s["turns"] for t in turn.get("tokens", []))
