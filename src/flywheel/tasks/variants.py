"""The SWE-bench family's field variants, normalised to SWE-bench's own fields before loading.

    record = normalize(json.loads(line))        # SWE-bench, SWE-Gym, SWE-smith, R2E-Gym -> SWE-bench fields
    variant_of(record)                          # "swebench" | "swe-gym" | "swe-smith" | "r2e-gym" | None

Why one small module: the sets share one idea (a repository at a commit, a reference patch, FAIL_TO_PASS and
PASS_TO_PASS) but name and shape the fields differently; the loader (loaders.py) reads one shape.

* SWE-bench, SWE-bench-extra, SWE-Gym: `instance_id, repo, base_commit, patch, test_patch, problem_statement,
  FAIL_TO_PASS, PASS_TO_PASS` (+ `version`, `environment_setup_commit`, `hints_text`, `created_at`); SWE-Gym has
  no `environment_setup_commit`. The lists may be JSON text (the hub's SWE-bench) or lists (SWE-Gym).
* SWE-smith: `instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS, image_name, problem_statement`, no
  `base_commit` and no `test_patch`: each instance is a branch named `instance_id` of the repository mirror whose
  tree holds the bug, and `patch` is the diff that *introduced* it (the reference fix is its reverse). Here the
  base commit is the branch `instance_id` of the local clone, and `patch` is kept as `meta["bug_patch"]`.
* R2E-Gym: `repo_name, commit_hash, problem_statement` (+ `docker_image`, `parsed_commit_content`,
  `expected_output_json`, ...): `commit_hash` is the fixing commit, so the task starts at its parent
  (`commit_hash~1`) and the reference fix is that commit. Its hidden tests live in the Docker image (`r2e_tests/`),
  not in the record: a record loads when it carries FAIL_TO_PASS / PASS_TO_PASS (pytest ids), or when
  `expected_output_json` maps pytest ids to PASSED/FAILED (the passing ones become FAIL_TO_PASS); otherwise it is a
  broken task that says so.
"""

from __future__ import annotations

import json
from typing import Any

SWE_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS",
              "PASS_TO_PASS")


def variant_of(d: dict[str, Any]) -> str | None:
    """Which member of the family a record looks like (None: not one)."""
    if "repo_name" in d and "commit_hash" in d:
        return "r2e-gym"
    if "instance_id" not in d:
        return None
    if "base_commit" not in d and ("image_name" in d or "patch" in d):
        return "swe-smith"
    if "environment_setup_commit" not in d and "version" in d:
        return "swe-gym"
    return "swebench"


def normalize(d: dict[str, Any]) -> dict[str, Any]:
    """`d` with SWE-bench's field names (a copy); records of no variant come back unchanged.
    Raises ValueError when a variant's record lacks what a task needs."""
    kind = variant_of(d)
    out = dict(d)
    if kind == "swe-smith":
        out["base_commit"] = d["instance_id"]  # the instance's branch in the local clone of the mirror
        out["bug_patch"] = out.pop("patch", "")
        out.setdefault("test_patch", "")
    elif kind == "r2e-gym":
        out.setdefault("instance_id", f"{d['repo_name']}-{str(d['commit_hash'])[:12]}")
        out["repo"] = d["repo_name"]
        out["base_commit"] = f"{d['commit_hash']}~1"
        out["fix_commit"] = d["commit_hash"]
        if "FAIL_TO_PASS" not in d and "PASS_TO_PASS" not in d:
            expected = d.get("expected_output_json")
            if isinstance(expected, str):
                try:
                    expected = json.loads(expected) if expected.strip() else {}
                except json.JSONDecodeError:
                    raise ValueError("field 'expected_output_json' is not JSON") from None
            if not isinstance(expected, dict) or not expected:
                raise ValueError("an R2E-Gym record needs FAIL_TO_PASS/PASS_TO_PASS or expected_output_json "
                                 "(pytest id -> PASSED/FAILED); its hidden tests are otherwise only in its image")
            out["FAIL_TO_PASS"] = [t for t, s in expected.items() if str(s).upper() == "PASSED"]
            out["PASS_TO_PASS"] = []
    if kind is not None:
        out["variant"] = kind
    return out
