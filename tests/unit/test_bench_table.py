"""docs/benchmarks.md holds the figures of every result file, as `flywheel bench table` renders them."""

import json
from pathlib import Path

from flywheel.bench._table import BEGIN, END, render, update
from flywheel.commands.bench import _targets

ROOT = Path(__file__).resolve().parents[2]


def test_docs_hold_the_generated_results():
    block = render(ROOT / "benchmarks" / "results", _targets())
    assert block in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"), \
        "regenerate with: flywheel bench table"


def test_render_reads_provenance_and_update_keeps_the_rest(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "pipeline_seeds.json").write_text(json.dumps({
        "summary": {"sync_over_async_wall": 1.5049, "passk_gap": -1.8},
        "machine": {"cpu_model": "Test CPU", "cpu_count": 2},
        "provenance": {"commit": "0123456789abcdef", "dirty": True, "date": "2026-12-02T00:00:00+00:00",
                       "command": "flywheel bench pipeline --seeds 0,1,2"}}))
    (results / "old.json").write_text(json.dumps({"summary": {"x": 1}}))
    block = render(results, ["pipeline", "engine"])
    assert "### pipeline" in block and "`pipeline_seeds.json`" in block and "| `sync_over_async_wall` | 1.505 |" in block
    assert "commit `0123456789` (uncommitted changes)" in block and "`flywheel bench pipeline --seeds 0,1,2`" in block
    assert "### old" in block and "commit and command not recorded" in block
    doc = tmp_path / "b.md"
    doc.write_text(f"# B\n\nintro\n\n{BEGIN}\nstale\n{END}\n\n## Notes\n\nkept\n")
    text = update(doc, block)
    assert text.startswith("# B\n\nintro\n\n") and "stale" not in text and text.endswith("\n\n## Notes\n\nkept\n")
