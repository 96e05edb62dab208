"""Tokenizer: byte-level BPE training, exact round trips, save/load, the cache in get_tokenizer."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.config import TokenizerConfig
from flywheel.policy import tokenizer as tokmod
from flywheel.policy.tokenizer import (
    SPECIAL_TOKENS,
    default_corpus,
    get_tokenizer,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

VOCAB = 1024


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(default_corpus(400_000), VOCAB)


def test_vocab_size_and_special_tokens(tok):
    assert len(tok) == VOCAB
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert ids == [0, 1, 2, VOCAB - 2, VOCAB - 1]
    for t, i in zip(SPECIAL_TOKENS, ids):
        assert tok.encode(t, add_special_tokens=False) == [i]
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == 0 and tok.pad_token_id == 0
    assert set(tok.all_special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    # encode adds nothing (no BOS/EOS): the chat format owns every token of the transcript
    assert tok.encode("x", add_special_tokens=True) == tok.encode("x", add_special_tokens=False)


ROUND_TRIP = [
    "",
    " ",
    "héllo wörld — 世界 🎉 👩‍💻",
    "def f(x):\r\n\treturn x  # trailing  \n\n\n",
    "\x00\x01\x7f control bytes \u200b zero-width",
    '<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call><|im_end|>',
    "a<|im_start|>b<|endoftext|>  <|im_end|>\n",
    "  leading spaces and tabs\t\t",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_examples(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_text(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_markers_are_single_tokens_inside_text(tok):
    ids = tok.encode("x<tool_call>{}</tool_call>y<|im_end|>", add_special_tokens=False)
    for marker in ["<tool_call>", "</tool_call>", "<|im_end|>"]:
        assert ids.count(tok.convert_tokens_to_ids(marker)) == 1
    # the tool-call tags survive skip_special_tokens (they are content), the control tokens do not
    assert tok.decode(ids, skip_special_tokens=True) == "x<tool_call>{}</tool_call>y"


def test_code_and_tool_json_are_compact(tok):
    code = "    def __init__(self, name, value=None):\n        self.name = name\n        return None\n"
    assert len(code) / len(tok.encode(code)) > 3.0  # bytes alone would be 1.0
    call = '<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call>'
    assert len(tok.encode(call)) <= 22


def test_default_corpus_is_deterministic_bounded_and_mixed():
    a = list(default_corpus(200_000))
    b = list(default_corpus(200_000))
    assert a == b
    total = sum(len(d.encode()) for d in a)
    assert 150_000 < total <= 200_000
    assert any("def " in d and "<|im_start|>" not in d for d in a)  # stdlib code
    chats = [d for d in a if d.startswith("<|im_start|>system\n")]
    assert chats and all("<tool_call>{\"name\": " in d and "# Tools\n" in d for d in chats)
    with pytest.raises(ValueError, match="max_bytes"):
        next(default_corpus(0))


def test_training_is_deterministic():
    corpus = list(default_corpus(60_000))
    a, b = train_tokenizer(corpus, 600), train_tokenizer(corpus, 600)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_train_rejects_bad_input():
    with pytest.raises(ValueError, match="vocab_size must be an int >= 261"):
        train_tokenizer(["abc"], 100)
    with pytest.raises(ValueError, match="min_frequency"):
        train_tokenizer(["abc"], 300, min_frequency=0)
    with pytest.raises(TypeError, match="corpus item 1 is bytes"):
        train_tokenizer(["abc", b"def"], 300)
    with pytest.raises(TypeError, match="not a single string"):
        train_tokenizer("abc", 300)


def test_save_load_round_trip(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    text = "def f():\n    return '世界' <tool_call>{}</tool_call><|im_end|>"
    assert again.encode(text) == tok.encode(text)
    assert again.chat_template == tok.chat_template
    assert len(again) == VOCAB and again.eos_token == "<|endoftext|>" and again.pad_token_id == 0
    assert again.convert_tokens_to_ids("<|im_end|>") == 2


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="could not load the tokenizer"):
        load_tokenizer(tmp_path)


def test_get_tokenizer_trains_once_then_loads(tmp_path, monkeypatch):
    cfg = TokenizerConfig(vocab_size=512, corpus_bytes=50_000)
    first = get_tokenizer(cfg, tmp_path)
    assert len(first) == 512
    cached = [p for p in tmp_path.iterdir()]
    assert [p.name for p in cached] == [tokmod.cache_key(cfg)]  # no temporary dirs left behind

    def no_training(*args, **kwargs):
        raise AssertionError("the second call must load the cache, not train")

    monkeypatch.setattr(tokmod, "train_tokenizer", no_training)
    t0 = time.perf_counter()
    second = get_tokenizer(cfg, tmp_path)
    assert time.perf_counter() - t0 < 2.0
    assert second.backend_tokenizer.to_str() == first.backend_tokenizer.to_str()
    # another vocab size is another cache entry
    assert tokmod.cache_key(TokenizerConfig(vocab_size=513, corpus_bytes=50_000)) != tokmod.cache_key(cfg)


def test_get_tokenizer_path_loads_that_dir(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "mine")
    loaded = get_tokenizer(TokenizerConfig(path=str(tmp_path / "mine")), tmp_path / "unused-cache")
    assert len(loaded) == VOCAB
    assert not (tmp_path / "unused-cache").exists()
    with pytest.raises(ValueError, match="does not exist"):
        get_tokenizer(TokenizerConfig(path=str(tmp_path / "nope")), tmp_path)


def test_saved_files_are_a_standard_hf_tokenizer(tok, tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer(tok, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|endoftext|>"
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto.encode("print('hi')") == tok.encode("print('hi')")
    text = auto.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
