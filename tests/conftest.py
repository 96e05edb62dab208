"""Shared fixtures. Tests run on CPU with tiny models built from config; nothing is downloaded."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
