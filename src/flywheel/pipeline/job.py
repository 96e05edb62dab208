"""The main job: tasks and tokenizer → mid-training → eval → asynchronous RL → eval → report.

    flywheel demo                              # configs/demo.toml, what `make demo` runs
    flywheel train configs/demo.toml --trainer.num_steps 40
    flywheel train configs/demo.toml --resume  # after Ctrl-C: continues from the last checkpoint

Every stage writes its result into the run directory and is skipped when that result is already there,
so an interrupted run resumes where it stopped (RL from its checkpoint, with the admitted trajectories
it had not trained on yet). `summary.json` holds `pass1_before` and `pass1_after`, and `pass1_gain_se`:
the standard error of the gain, paired over held-out tasks (`rollout.evaluate.paired_difference`);
`copy_probe_base`: how often the base copies a held-out task's known edit (pipeline/copy_probe.py).
With a pretrained model (`model.import_from`, configs/real.toml) it also holds `pass1_pretrained` (the imported
model, before mid-training) and `midtrain_gain_se`; with `eval.humaneval` = N, `humaneval_before`,
`humaneval_after` and `humaneval_change_se` (N HumanEval problems through the harness, greedy, never trained on).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from flywheel.config import FlywheelConfig, save_config
from flywheel.envs.env import system_prompt
from flywheel.envs.tools import tools_for
from flywheel.metrics.report import write_report
from flywheel.orchestrator.loop import run_rl
from flywheel.pipeline.copy_probe import copy_probe
from flywheel.pipeline.evaluation import evaluate_model
from flywheel.pipeline.midtrain import midtrain
from flywheel.pipeline.prepare import prepare_pretrained, prepare_tasks, prepare_tokenizer, tokenizer_dir
from flywheel.pipeline.rundir import claim_run_dir
from flywheel.policy.chat import ChatFormat
from flywheel.policy.model import load_model
from flywheel.policy.model_dir import resolve_model_dir
from flywheel.rollout.evaluate import paired_difference
from flywheel.tasks.humaneval import humaneval_tasks


class Progress:
    """A thin wrapper over rich's progress bars: one bar per stage with elapsed time and ETA, from callbacks."""

    def __init__(self, enabled: bool = True):
        self.console = Console()
        self._bars = RichProgress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                                  TimeRemainingColumn(), console=self.console, disable=not enabled)
        self._ids: dict[str, TaskID] = {}
        self._started: dict[str, tuple[float, int]] = {}

    def __enter__(self):
        self._bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bars.__exit__(*exc)

    def update(self, stage: str, done: int, total: int | None = None, info: str = "") -> None:
        if not self.console.is_terminal:  # a log file or CI: a plain line every tenth of the way, with the ETA
            t0, done0 = self._started.setdefault(stage, (time.monotonic(), done))  # rate from the first report on
            if total and (done == total or done % max(1, total // 10) == 0):
                rate = (done - done0) / max(1e-9, time.monotonic() - t0)
                eta = f" eta {(total - done) / rate:.0f} s" if rate > 0 and done < total else ""
                self.console.print(f"{stage}: {done}/{total} {info}".rstrip() + eta)
            return
        if stage not in self._ids:
            self._ids[stage] = self._bars.add_task(stage, total=total, info=info)
        self._bars.update(self._ids[stage], completed=done, total=total, info=info)

    def log(self, text: str) -> None:
        self.console.print(text)


def probe_copying(cfg: FlywheelConfig, model_dir: Path, tokenizer, tasks) -> dict[str, float]:
    model = load_model(Path(model_dir), cfg.model.dtype)
    return copy_probe(model, ChatFormat(tokenizer, tools_for(cfg.env), cfg.model.tool_format), system_prompt(cfg.env), tasks)


def run_job(cfg: FlywheelConfig, *, resume: bool = False, show_progress: bool = True) -> dict:
    # One intra-op thread: at these model sizes a second thread gains little, and when anything else runs
    # (sandboxed tests, the rollout process) oversubscribed OpenMP threads spin and cost 10-50x.
    torch.set_num_threads(1)
    run_dir = Path(cfg.run_dir)
    changed = claim_run_dir(cfg, resume=resume)
    if cfg.model.path:  # a typo is found now, not after the tasks and the tokenizer are built
        resolve_model_dir(cfg.model.path, option="model.path")
        tokenizer_dir(cfg, run_dir)  # and a base without its tokenizer
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir)
    summary_path = run_dir / "summary.json"
    summary: dict = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    t0 = time.monotonic()

    def save_summary() -> None:
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")

    timings = summary.setdefault("timings_s", {})  # wall seconds per stage (a resumed stage adds up)
    mark = [time.monotonic()]

    def lap(stage: str) -> None:
        now = time.monotonic()
        timings[stage] = round(timings.get(stage, 0.0) + now - mark[0], 1)
        mark[0] = now

    with Progress(show_progress) as progress:
        if changed:
            progress.log(f"resuming with {len(changed)} changed key(s) (stages already in {run_dir} are kept): "
                         + "; ".join(changed[:6]) + (" ..." if len(changed) > 6 else ""))
        train_tasks, heldout = prepare_tasks(cfg, run_dir)
        pretrained = prepare_pretrained(cfg, run_dir)
        tokenizer = prepare_tokenizer(cfg, run_dir, train_tasks, pretrained)
        progress.log(f"tasks: {len(train_tasks)} train, {len(heldout)} held-out; vocab {len(tokenizer)}")
        lap("tasks_and_tokenizer")
        base = Path(cfg.model.path) if cfg.model.path else midtrain(
            cfg, run_dir, tokenizer, train_tasks, on_progress=lambda s, i, n: progress.update(s, i, n),
            pretrained=pretrained)
        lap("midtrain")
        if "copy_probe_base" not in summary:  # seconds: whether mid-training taught copying (pipeline/copy_probe.py)
            try:
                summary["copy_probe_base"] = probe_copying(cfg, base, tokenizer, heldout)
                progress.log(f"copy probe of the base: {summary['copy_probe_base']['exact']:.2f} of held-out "
                             f"edits exact")
            except ValueError as err:  # held-out tasks without a known fix: nothing to probe
                summary["copy_probe_base"] = {}
                progress.log(f"copy probe skipped: {err}")
        cache = run_dir / "cache" / "eval"
        humaneval = humaneval_tasks(cfg.eval.humaneval) if cfg.eval.humaneval else []
        greedy = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"num_samples": 1, "temperature": 0.0})})

        def evaluate(name: str, model_dir: Path, tasks=heldout, run_cfg=cfg) -> float:
            rows: list[dict] = []

            def done(row: dict) -> None:
                rows.append(row)
                solved = sum(r["correct"] > 0 for r in rows)
                progress.update(f"eval {name}", len(rows), len(tasks), f"solved {solved}")

            res = evaluate_model(run_cfg, model_dir, tokenizer, tasks, cache, run_dir / f"eval_{name}.jsonl", done)
            progress.log(f"{'HumanEval' if tasks is humaneval else 'held-out'} pass@1 {name}: {res.pass_at[1]:.3f}")
            return res.pass_at[1]

        def paired_se(after: str, before: str) -> float:
            return paired_difference(*([json.loads(line) for line in (run_dir / f"eval_{name}.jsonl").read_text()
                                        .splitlines()] for name in (after, before)))[1]

        if pretrained is not None and "pass1_pretrained" not in summary:  # the imported model, before mid-training
            summary["pass1_pretrained"] = evaluate("pretrained", pretrained)
            lap("eval_pretrained")
            save_summary()
        if "pass1_before" not in summary:
            summary["pass1_before"] = evaluate("before", base)
            if pretrained is not None:
                summary["midtrain_gain_se"] = paired_se("before", "pretrained")
            lap("eval_before")
            save_summary()
        if humaneval and "humaneval_before" not in summary:
            summary["humaneval_before"] = evaluate("humaneval_before", base, humaneval, greedy)
            lap("eval_humaneval_before")
            save_summary()

        def on_step(rec: dict) -> None:
            progress.update("RL", rec["step"], cfg.trainer.num_steps,
                            f"reward {rec.get('rollout/reward_all', rec['reward/mean']):.2f} "
                            f"pass {rec.get('rollout/pass_rate_all', rec['rollout/pass_rate']):.2f} "
                            f"stale {rec['staleness/mean']:.1f}")

        rl = run_rl(cfg, run_dir, base, tokenizer_dir(cfg, run_dir), train_tasks, resume=resume, on_step=on_step)
        summary["rl"] = rl
        lap("rl")
        save_summary()
        if rl["interrupted"]:
            h = rl.get("halted")
            if h and h.get("reason") == "no_signal":
                progress.log(f"halted: the last {h['groups']} groups each earned one reward for every session, so no "
                             "trainer step could run (orchestrator.halt_without_signal); mid-train the policy more "
                             "(midtrain.*), train on easier tasks (synth.difficulties), or set "
                             "orchestrator.drop_uniform_groups = false")
            elif h:
                progress.log(f"halted: flag {h['flag']} raised by {h['rate']:.1%} of the last {h['window']} graded "
                             f"sessions (env.halt_on_flag_rate = {h['threshold']}); read the transcripts in "
                             f"{run_dir / 'trajectories'}, then continue with --resume")
            progress.log(f"stopped at step {rl['steps']}; continue with --resume")
            return summary
        summary["pass1_after"] = evaluate("after", run_dir / "final_model")
        summary["pass1_gain"] = summary["pass1_after"] - summary["pass1_before"]
        summary["pass1_gain_se"] = paired_se("after", "before")
        if humaneval:
            summary["humaneval_after"] = evaluate("humaneval_after", run_dir / "final_model", humaneval, greedy)
            summary["humaneval_change"] = summary["humaneval_after"] - summary["humaneval_before"]
            summary["humaneval_change_se"] = paired_se("humaneval_after", "humaneval_before")
        lap("eval_after")
        summary["wall_s"] = summary.get("wall_s", 0.0) + time.monotonic() - t0
        save_summary()
        report = write_report(run_dir)
        progress.log(f"pass@1 before {summary['pass1_before']:.3f} → after {summary['pass1_after']:.3f} "
                     f"(gain ± {summary['pass1_gain_se']:.3f}, paired SE over tasks); report: {report}")
    return summary
