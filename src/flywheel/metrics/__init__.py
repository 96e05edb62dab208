"""Metrics: JSONL (+ TensorBoard) logging and the HTML run report."""
