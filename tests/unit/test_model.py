import pytest
import torch

from flywheel.config import ModelConfig
from flywheel.policy.model import build_model, is_moe, load_model, num_parameters, save_model


@pytest.mark.parametrize("preset,lo,hi", [("tiny", 1e6, 5e6), ("small", 30e6, 100e6), ("tiny-moe", 1e6, 5e6)])
def test_preset_sizes(preset, lo, hi):
    model = build_model(ModelConfig(preset=preset), vocab_size=2048)
    assert lo <= num_parameters(model) <= hi
    assert is_moe(model) == (preset == "tiny-moe")


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_save_load_round_trip_is_bit_exact(tmp_path, preset):
    model = build_model(ModelConfig(preset=preset, seed=3), vocab_size=512)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(model(ids).logits, again(ids).logits)


def test_num_layers_changes_depth_only(tmp_path):
    deep, shallow = (build_model(ModelConfig(preset="tiny", num_layers=n), 512) for n in (0, 2))
    assert (deep.config.num_hidden_layers, shallow.config.num_hidden_layers) == (4, 2)
    shapes = {k: v.shape for k, v in shallow.state_dict().items()}
    assert shapes == {k: v.shape for k, v in deep.state_dict().items() if k in shapes}  # same matrices, fewer
    save_model(shallow, tmp_path / "m")
    assert load_model(tmp_path / "m").config.num_hidden_layers == 2


def test_seeded_init_is_reproducible():
    a = build_model(ModelConfig(preset="tiny", seed=1), 512).state_dict()
    b = build_model(ModelConfig(preset="tiny", seed=1), 512).state_dict()
    c = build_model(ModelConfig(preset="tiny", seed=2), 512).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="model.path"):
        build_model(ModelConfig(preset=None), 512)
