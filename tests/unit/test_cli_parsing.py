"""The command line's conventions: overrides anywhere, one-line errors, tracebacks only for bugs (cli.py)."""

import json

import pytest

from flywheel import __version__, cli
from flywheel.config import UserError, load_config
from flywheel.pipeline.rundir import claim_run_dir, config_changes
from flywheel.policy.chat import ChatFormat, parse_turn
from flywheel.policy.tokenizer import train_tokenizer


def test_an_override_value_is_never_taken_for_the_config_path():
    """`serve CONFIG --online.learner.enabled false` once read `false` as the config path."""
    _, args, mod = cli.parse(["serve", "configs/online.toml", "--online.learner.enabled", "false"])
    assert args.config == "configs/online.toml" and args.overrides == ["--online.learner.enabled", "false"]
    _, args, _ = cli.parse(["serve", "--online.learner.enabled", "false", "configs/online.toml", "--model", "m"])
    assert args.config == "configs/online.toml" and args.model == "m"
    assert load_config(args.config, args.overrides).online.learner.enabled is False
    _, args, _ = cli.parse(["env-server", "--env.tools=core", "--port", "0", "--run_dir", "r", "--trainer.lr", "-1"])
    assert args.port == 0 and args.overrides == ["--env.tools=core", "--run_dir", "r", "--trainer.lr", "-1"]


def test_a_command_option_named_like_a_top_level_key_stays_the_commands():
    """`eval --tasks FILE` is eval's option although `tasks` is a top-level config key; `--seed` of
    `tasks synth` likewise."""
    _, args, _ = cli.parse(["eval", "--tasks", "t.jsonl", "--model", "m", "--seed", "3"])
    assert args.tasks == "t.jsonl" and args.overrides == ["--seed", "3"]
    _, args, _ = cli.parse(["tasks", "synth", "--n", "2", "--seed", "7", "--out", "x.jsonl"])
    assert args.seed == 7 and args.overrides == []


@pytest.mark.parametrize("argv, message", [
    (["eval", "--tasks", "t", "--model", "m", "--trainer.lr"], "override --trainer.lr needs a value"),
    (["keys", "list", "--db", "x.db", "--trainer.lr", "1"], "takes no config overrides"),
])
def test_bad_overrides_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_help_lists_the_override_convention_and_the_sections(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--section.key VALUE or --section.key=VALUE" in out and "trainer" in out and "online" in out


def test_version_prints_the_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"flywheel {__version__}"


def test_bench_lists_only_modules_that_are_targets(tmp_path, monkeypatch):
    """A bench module is a target when it defines run(args); a shared helper module without run() is not."""
    from flywheel import bench
    from flywheel.commands.bench import _targets

    assert {"engine", "weights", "online"} <= set(_targets())
    (tmp_path / "measured.py").write_text("def run(args):\n    return {}\n")
    (tmp_path / "helpers.py").write_text("def launch():\n    pass\n")
    (tmp_path / "_private.py").write_text("def run(args):\n    return {}\n")
    monkeypatch.setattr(bench, "__path__", [str(tmp_path)])
    assert _targets() == ["measured"]


@pytest.fixture
def broken_command(monkeypatch):
    """A command whose run() has a bug: what a user sees then."""
    from flywheel.commands import report

    def run(args):
        raise KeyError("surprise")

    monkeypatch.setattr(report, "run", run)


def test_a_bug_is_one_line_and_exit_1_with_the_traceback_under_debug(broken_command, capsys, monkeypatch):
    monkeypatch.delenv("FLYWHEEL_DEBUG", raising=False)
    assert cli.main(["report", "runs/x"]) == 1
    err = capsys.readouterr().err
    assert "unexpected error: KeyError: 'surprise'" in err and "--debug" in err and "Traceback" not in err
    assert cli.main(["--debug", "report", "runs/x"]) == 1
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["report", "runs/x", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("FLYWHEEL_DEBUG", "1")
    assert cli.main(["report", "runs/x"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_a_run_dir_with_another_configs_stages_is_refused_unless_resumed_or_fresh(tmp_path):
    run_dir = tmp_path / "run"
    old = load_config(None, ["--run_dir", str(run_dir), "--synth.num_train", "8"])
    assert claim_run_dir(old, resume=False) == []  # a new directory
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(old.model_dump(mode="json")))
    assert claim_run_dir(old, resume=False) == []  # the same config: its stages are reused (midtrain, then train)
    new = load_config(None, ["--run_dir", str(run_dir), "--synth.num_train", "600"])
    with pytest.raises(UserError, match=r"synth.num_train: 8 → 600.*--resume.*--fresh"):
        claim_run_dir(new, resume=False)
    assert claim_run_dir(new, resume=True) == ["synth.num_train: 8 → 600"]
    (run_dir / "checkpoints").mkdir()
    with pytest.raises(UserError, match="already holds a run"):
        claim_run_dir(old, resume=False)
    assert config_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == ["a.c: null → 2"]


def test_fresh_deletes_only_a_run_directory(tmp_path):
    from flywheel.commands.train import remove_run_dir

    stranger = tmp_path / "home"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a flywheel run directory"):
        remove_run_dir(stranger)
    assert (stranger / "notes.txt").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    remove_run_dir(run)
    assert not run.exists()


def test_an_undeclared_tool_call_stays_in_the_shown_text():
    """The serving API shows `shown`: a call to a tool the request did not declare is the model's text, not an
    empty message (online/server.py)."""
    call = '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>'
    turn = parse_turn("Let me clean up. " + call + " Done.", {})
    assert turn.tool_calls == [] and len(turn.errors) == 1
    assert turn.content == "Let me clean up.  Done." and turn.shown == "Let me clean up. " + call + " Done."
    tools = {"view": {"name": "view", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    good = '<tool_call>\n{"name": "view", "arguments": {"path": "a.py"}}\n</tool_call>'
    turn = parse_turn("ok " + good + call + "</tool_call>", tools)
    assert len(turn.tool_calls) == 1 and turn.shown == "ok " + call + "</tool_call>"


def test_a_tokenizer_without_chatml_markers_is_refused_with_what_to_pick():
    tok = train_tokenizer(["def f(x):\n    return x\n"] * 50, 300)
    backend = json.loads(tok.backend_tokenizer.to_str())
    backend["added_tokens"] = [t for t in backend["added_tokens"] if t["content"] != "<|im_start|>"]
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(backend)))
    with pytest.raises(UserError, match="ChatML chat template") as err:
        ChatFormat(bare)
    assert "train a tokenizer" not in str(err.value)


def test_a_run_without_learning_signal_says_so_once(caplog):
    """An untrained policy that solves nothing: every group uniform, no step can run; the loop says why."""
    from flywheel.orchestrator.loop import NoSignalWatch
    from flywheel.types import Reward, Trajectory

    cfg = load_config(None, ["--trainer.batch_size", "4", "--rollout.group_size", "2"])
    watch = NoSignalWatch(cfg)
    group = [Trajectory(task_id="t", group_id="g", reward=Reward(value=0.0)) for _ in range(2)]
    with caplog.at_level("WARNING"):
        for _ in range(watch.limit - 1):
            watch.observe("uniform", group)
        watch.observe("admitted", group)  # a group with signal resets the count
        for _ in range(watch.limit * 2):
            watch.observe("uniform", group)
    warnings = [r for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 1 and "drop_uniform_groups" in warnings[0].getMessage()
    halting = NoSignalWatch(load_config(None, ["--orchestrator.halt_without_signal", "3"]))
    assert [halting.observe(v, group) for v in ("uniform", "uniform", "admitted", "uniform", "uniform", "uniform")] \
        == [False, False, False, False, False, True]
