"""JUnit XML reports of pytest-compatible runners: node ids to report keys, reports to per-test statuses.

    report = parse_junit(xml_text)                 # {(classname, name): passed/failed/error/skipped}
    statuses_of(test_ids, report)                  # {test id: status, "missing" when not in the report}

A report is written by the process that ran the tests, so it is never trusted on its own: the in-process path
reconciles it with the guard's proofs (envs/guard.py), the suite verdict only lets it turn a pass into a failure
(envs/suite.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from flywheel.tasks.loaders import node_parts


def junit_key(test_id: str) -> tuple[str, str]:
    """pytest node id -> the (classname, name) pytest writes in JUnit XML."""
    path, classes, name = node_parts(test_id)
    module = path.removesuffix(".py").replace("/", ".").replace("\\", ".")
    return ".".join([module, *classes]), name


def parse_junit(xml_text: str) -> dict[tuple[str, str], str]:
    """(classname, name) -> passed/failed/error/skipped. Raises ValueError on XML that is not a report."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as err:
        raise ValueError(f"test report is not valid XML: {err}") from None
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        status = ("error" if "error" in tags else "failed" if "failure" in tags
                  else "skipped" if "skipped" in tags else "passed")
        if key not in out or rank[status] > rank[out[key]]:
            out[key] = status
    return out


def statuses_of(test_ids: list[str], report: dict[tuple[str, str], str]) -> dict[str, str]:
    return {tid: report.get(junit_key(tid), "missing") for tid in test_ids}
