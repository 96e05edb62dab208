"""The stages of a run, one module each: prepare (tokenizer, tasks), transcripts and mid-training,
evaluation, and the demo that chains them with RL (orchestrator/loop.py)."""
