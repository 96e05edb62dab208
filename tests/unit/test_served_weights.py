"""weights.publish_served: the store publishes the weights as a low-precision engine serves them; the delta is
computed on that form, and the engine installs those values as published and is checked against them bit for bit."""

import copy

import pytest
import torch

from flywheel.config import ConfigError, ModelConfig, validate
from flywheel.inference.local import LocalEngine
from flywheel.modeling.quant import SCALES, fake_quant, from_served_tensors, is_quantized_weight, quantize_weight, served_tensors
from flywheel.orchestrator.trainer_service import served_form
from flywheel.policy.model import build_model
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import IntegrityError, Publisher, Subscriber

Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=256)


def _versions(tiny, n=3, lr=1e-4):
    """n state dicts, each a small step (relative `lr`) from the one before, as a trainer's versions are."""
    g = torch.Generator().manual_seed(1)
    sd = {k: v.detach().clone() for k, v in tiny.state_dict().items()}
    out = [sd]
    for _ in range(n - 1):
        sd = {k: v + lr * v.abs().mean() * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
              for k, v in sd.items()}
        if tiny.config.tie_word_embeddings:  # one tensor under two names
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        out.append(sd)
    return out


def _publish(root, fmt, versions, served):
    cfg = validate({"inference": {"weight_dtype": fmt}, "weights": {"publish_served": served}})
    with Publisher(WeightStore(str(root)), anchor_every=100, num_threads=1, **served_form(cfg)) as pub:
        metrics = [pub.publish(v, sd).result() for v, sd in enumerate(versions)]
    return metrics


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])  # nvfp4: quantizing its own output again moves some values
def test_an_engine_serves_the_published_served_form_bit_for_bit(tiny, tmp_path, fmt):
    versions = _versions(tiny)
    metrics = _publish(tmp_path / "served", fmt, versions, True)
    store = WeightStore(str(tmp_path / "served"))
    manifest = store.read_manifest(2)
    assert manifest["served_format"] == fmt and manifest["tensors"][Q]["dtype"] == "uint8"  # the format's bytes
    assert Q + SCALES in manifest["tensors"] and manifest["tensors"]["model.norm.weight"]["dtype"] == "float32"
    engine = LocalEngine(copy.deepcopy(tiny), weight_dtype=fmt, max_seq_len=256)
    sub = Subscriber(store, engine, num_threads=1)
    for v in range(3):
        assert sub.poll(target=v) == v, sub.last_error
        params = engine.model.state_dict()
        assert torch.equal(params[Q], quantize_weight(Q, versions[v][Q], fmt))  # quantized once, by the publisher
        assert torch.equal(params["model.norm.weight"], versions[v]["model.norm.weight"])  # not a quantized weight
    assert sub.metrics[-1]["path"] == "delta"
    # the delta on the served form's codes: a small step moves few values across the format's grid
    raw = _publish(tmp_path / "raw", fmt, versions, False)
    assert metrics[2]["bytes_published"] < raw[2]["bytes_published"], (metrics[2], raw[2])
    assert metrics[2]["changed_fraction"] < raw[2]["changed_fraction"]


def test_an_engine_of_another_format_or_one_that_changes_the_values_is_refused(tiny, tmp_path):
    versions = _versions(tiny, n=1)
    _publish(tmp_path, "nvfp4", versions, True)
    store = WeightStore(str(tmp_path))
    bf16 = LocalEngine(copy.deepcopy(tiny), max_seq_len=256)
    sub = Subscriber(store, bf16, num_threads=1)
    assert sub.poll() is None and "inference.weight_dtype = 'nvfp4'" in str(sub.last_error)

    engine = LocalEngine(copy.deepcopy(tiny), weight_dtype="nvfp4", max_seq_len=256)
    install = engine.update_weights

    def quantizes_again(version, tensors, served_format=None):  # an engine that quantized what it was served
        pause = install(version, tensors, served_format=served_format)
        for n, t in engine.model.state_dict().items():
            if is_quantized_weight(n, t):
                t.copy_(fake_quant(t, "nvfp4"))  # not idempotent: some blocks' scales round to another e4m3 value
        return pause
    engine.update_weights = quantizes_again  # type: ignore[method-assign]
    with pytest.raises(IntegrityError, match="other values than the nvfp4 weights"):
        Subscriber(store, engine, num_threads=1).poll()


def test_without_a_low_precision_engine_the_served_form_is_the_weights_and_bad_combinations_are_refused():
    assert served_form(validate({"weights": {"publish_served": True}})) == {}
    assert served_form(validate({"inference": {"weight_dtype": "fp8_e4m3"}})) == {}
    for extra, where in [({"trainer": {"world_size": 2}}, "trainer.world_size = 2"),
                         ({"inference": {"weight_dtype": "fp8_e4m3", "type": "vllm"}}, "inference.type = 'vllm'"),
                         ({"inference": {"weight_dtype": "fp8_e4m3", "dtype": "bfloat16"}}, "inference.dtype")]:
        data = {"inference": {"weight_dtype": "fp8_e4m3"}, "weights": {"publish_served": True}}
        for k, v in extra.items():
            data[k] = {**data.get(k, {}), **v}
        with pytest.raises(ConfigError, match="weights.publish_served = false") as err:
            validate(data)
        assert where in str(err.value)


def test_a_served_form_update_that_does_not_fit_names_the_tensor(tiny):
    like = tiny.state_dict()
    good = served_tensors(Q, like[Q], "fp8_e4m3")
    assert torch.equal(from_served_tensors(good, "fp8_e4m3", like)[Q], quantize_weight(Q, like[Q], "fp8_e4m3"))
    with pytest.raises(ValueError, match=f"came without its scales '{Q}#scales'"):
        from_served_tensors({Q: good[Q]}, "fp8_e4m3", like)
    with pytest.raises(ValueError, match="without the codes"):
        from_served_tensors({Q + SCALES: good[Q + SCALES]}, "fp8_e4m3", like)
    with pytest.raises(ValueError, match=f"codes of '{Q}'.*do not fit its shape"):
        from_served_tensors({Q: good[Q][:-8], Q + SCALES: good[Q + SCALES]}, "fp8_e4m3", like)
