from pathlib import Path

import pytest

from flywheel.config import ConfigError, FlywheelConfig, apply_overrides, load_config, save_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.toml")), ids=lambda p: p.name)
def test_every_config_file_parses(path):
    cfg = load_config(path)
    assert isinstance(cfg, FlywheelConfig)


def test_overrides_are_typed():
    cfg = load_config(None, ["--trainer.lr", "3e-6", "--orchestrator.mode=sync", "--env.partial_credit", "true"])
    assert cfg.trainer.lr == 3e-6
    assert cfg.orchestrator.mode == "sync"
    assert cfg.env.partial_credit is True


def test_unknown_key_names_key_and_allowed():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--trainer.lrr", "1e-3"])
    msg = str(e.value)
    assert "trainer.lrr" in msg and "lr" in msg and "batch_size" in msg


def test_unknown_section_is_refused():
    with pytest.raises(ConfigError, match="unknown key 'trainr'"):
        load_config(None, ["--trainr.lr", "1e-3"])


def test_out_of_bounds_value_names_bound():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--trainer.lr", "-1"])
    assert "trainer.lr" in str(e.value) and "greater than 0" in str(e.value)


@pytest.mark.parametrize("key, what", [("tp", "tensor"), ("ep", "expert")])
def test_reserved_parallelism_is_refused_with_what_to_change(key, what):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--trainer.world_size", "2", f"--trainer.mesh.{key}", "2"])
    msg = str(e.value)
    assert f"trainer.mesh.{key} = 2" in msg and f"{what} parallelism is reserved" in msg
    assert f"Set trainer.mesh.{key} = 1" in msg
    assert load_config(None, ["--trainer.world_size", "2", f"--trainer.mesh.{key}", "1"]).trainer.mesh.dp_shard == -1


def test_bad_literal_lists_choices():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--orchestrator.mode", "fast"])
    assert "'async' or 'sync'" in str(e.value)


def test_malformed_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer\nlr = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_override_needs_value_and_dashes():
    with pytest.raises(ConfigError, match="needs a value"):
        apply_overrides({}, ["--trainer.lr"])
    with pytest.raises(ConfigError, match="must look like"):
        apply_overrides({}, ["trainer.lr", "1"])


def test_resolved_config_saved_as_json(tmp_path):
    cfg = load_config(None, ["--trainer.lr", "2e-5"])
    path = save_config(cfg, tmp_path)
    again = FlywheelConfig.model_validate_json(path.read_text())
    assert again == cfg


def test_global_seed_seeds_sections_not_set_explicitly(tmp_path):
    cfg = load_config(None, ["--seed", "7", "--trainer.seed", "3"])
    assert (cfg.model.seed, cfg.midtrain.seed, cfg.trainer.seed) == (7, 7, 3)
    assert FlywheelConfig(seed=2, midtrain={"lr": 1e-3}).midtrain.seed == 2
    saved = FlywheelConfig.model_validate_json(save_config(cfg, tmp_path).read_text())  # a run dir's config.json
    assert (saved.model.seed, saved.midtrain.seed, saved.trainer.seed) == (7, 7, 3)


def test_config_reference_doc_is_current():
    from flywheel.config.reference import reference_markdown

    assert (ROOT / "docs" / "config.md").read_text().strip() == reference_markdown().strip(), \
        "regenerate with: python -m flywheel.config > docs/config.md"


def test_a_ray_key_from_before_the_ray_table_names_its_new_place():
    with pytest.raises(ConfigError, match=r"orchestrator\.ray_num_graders moved to orchestrator\.ray\.num_graders"):
        load_config(None, ["--orchestrator.ray_num_graders", "2"])
    cfg = load_config(None, ["--orchestrator.ray.num_graders", "2", "--orchestrator.ray.regions", '["us", "eu"]'])
    assert cfg.orchestrator.ray.num_graders == 2 and cfg.orchestrator.ray.regions == ["us", "eu"]


def test_config_reference_documents_each_section_once():
    """A nested section (trainer.mesh, online.serve, ...) is one table, linked from its parent's."""
    from flywheel.config.reference import reference_markdown

    headings = [line for line in reference_markdown().splitlines() if line.startswith("## ")]
    assert len(headings) == len(set(headings)) and "## `trainer.mesh`" in headings
