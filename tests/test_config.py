"""Typed config loading: defaults -> file -> overrides; unknown keys and wrong types rejected."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from raycompat.config import ConfigError, load_config, parse_overrides, save_config


@dataclass
class Optim:
    lr: float = 0.1
    epochs: int = 3


@dataclass
class Job:
    name: str = "demo"
    method: Literal["ift", "bct"] = "ift"
    seeds: list[int] = field(default_factory=lambda: [0])
    weights: str | None = None
    optim: Optim = field(default_factory=Optim)


def test_defaults_file_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\noptim:\n  lr: 1\n")
    cfg = load_config(Job, path, ["optim.epochs=7", "method=bct", "seeds=[1, 2]"])
    assert cfg.name == "x" and cfg.optim.lr == 1.0 and cfg.optim.epochs == 7
    assert cfg.method == "bct" and cfg.seeds == [1, 2] and cfg.weights is None
    out = tmp_path / "merged.yaml"
    save_config(cfg, out)
    assert load_config(Job, out) == cfg


def test_unknown_key_names_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lrr: 1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown config key\(s\) optim.lrr; valid keys"):
        load_config(Job, path)


@pytest.mark.parametrize(
    "override,match",
    [
        ("optim.epochs=three", "optim.epochs: expected int"),
        ("method=lwf", "method: 'lwf' is not one of"),
        ("optim=3", "optim: expected a mapping"),
        ("seeds=[a]", r"seeds\[0\]: expected int"),
    ],
)
def test_wrong_types(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(Job, None, [override])


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["epochs"])
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(Job, tmp_path / "nope.yaml")


def test_apply_overrides_revalidates_a_loaded_config():
    from raycompat.config import apply_overrides
    from raycompat.train.config import TrainConfig

    base = load_config(TrainConfig, None, ["epochs=2"])
    changed = apply_overrides(base, ["optim.lr=0.5", "method_options.lam=0.2"])
    assert (changed.epochs, changed.optim.lr, changed.method_options) == (2, 0.5, {"lam": 0.2})
    assert base.optim.lr != 0.5  # the original is untouched
    with pytest.raises(ConfigError, match="optim.lrr"):
        apply_overrides(base, ["optim.lrr=0.5"])


def test_exponent_floats_without_a_dot_are_floats_everywhere(tmp_path):
    """YAML 1.1 reads 3e-5 as a string; a config, an override and a sampled sweep value
    (json.dumps(3e-05) == "3e-05") all mean the float."""
    from raycompat.train.config import TrainConfig
    from raycompat.tune.space import trial_overrides

    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-4}\nmethod_options: {lam: 5E-1}\n")
    cfg = load_config(TrainConfig, path, ["optim.weight_decay=3e-5"])
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 3e-5
    assert cfg.method_options == {"lam": 0.5}
    sampled = load_config(TrainConfig, None, trial_overrides({"optim.lr": 3.2e-05}))
    assert sampled.optim.lr == 3.2e-05
    assert load_config(TrainConfig, None, ["run.name=1e5x"]).run.name == "1e5x"


# ---------------------------------------------------------------------------- ranges
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("epochs", [0, -3])
def test_train_epochs_below_one_are_refused_at_load_time(tmp_path, epochs):
    from raycompat.train.config import TrainConfig

    with pytest.raises(ConfigError, match=rf"^epochs must be >= 1, got {epochs}$"):
        load_config(TrainConfig, None, [f"epochs={epochs}"])
    path = tmp_path / "train.yaml"
    path.write_text(f"epochs: {epochs}\n")
    with pytest.raises(ConfigError, match=rf"train.yaml: epochs must be >= 1, got {epochs}"):
        load_config(TrainConfig, path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("batch_size=0", "batch_size must be >= 1, got 0"),
        ("optim.lr=0", "optim.lr must be > 0.0, got 0.0"),
        ("optim.lr=-1e-3", "optim.lr must be > 0.0, got -0.001"),
    ],
)
def test_other_broken_training_values_are_refused(override, message):
    from raycompat.config import apply_overrides
    from raycompat.train.config import TrainConfig

    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        load_config(TrainConfig, None, [override])
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        apply_overrides(TrainConfig(), [override])  # a sweep's sampled values too


@pytest.mark.parametrize("epochs", [0, -3])
def test_upgrade_job_refuses_training_epochs_below_one_before_running(epochs):
    """``training.epochs=0`` used to publish a gallery extracted by an untrained model."""
    import importlib.util

    from raycompat.upgrade.config import UpgradeConfig

    with pytest.raises(ConfigError, match=rf"training.epochs must be >= 1, got {epochs}"):
        load_config(UpgradeConfig, None, [f"training.epochs={epochs}"])
    spec = importlib.util.spec_from_file_location("upgrade_job", ROOT / "jobs" / "upgrade.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    with pytest.raises(ConfigError, match=rf"training.epochs must be >= 1, got {epochs}"):
        job.main([f"training.epochs={epochs}"])  # refused while loading, before Ray starts


def test_upgrade_entry_epochs_and_python_built_configs_are_checked():
    import dataclasses

    from raycompat.upgrade.config import UpgradeConfig, check_upgrade_config

    history = "[{model_version: a, classes: 4}, {model_version: b, classes: 5, epochs: 0}]"
    with pytest.raises(ConfigError, match=r"upgrades\[1\].epochs must be >= 1, got 0"):
        load_config(UpgradeConfig, None, [f"upgrades={history}"])
    cfg = UpgradeConfig()
    cfg.training = dataclasses.replace(cfg.training, epochs=0)
    with pytest.raises(ConfigError, match="training.epochs must be >= 1, got 0"):
        check_upgrade_config(cfg)
    cfg = UpgradeConfig()
    cfg.upgrades[2].epochs = -1
    with pytest.raises(ConfigError, match=r"upgrades\[2\].epochs must be >= 1, got -1"):
        check_upgrade_config(cfg)


def test_check_range_bounds_and_none():
    from raycompat.config import bounded, check_range

    @dataclass
    class Ranged:
        fraction: float = bounded(0.2, ge=0.0, lt=1.0)
        limit: int | None = bounded(None, ge=1)

    assert load_config(Ranged, None, ["fraction=0"]).limit is None  # None is not checked
    with pytest.raises(ConfigError, match="fraction must be < 1.0, got 1.0"):
        load_config(Ranged, None, ["fraction=1"])
    with pytest.raises(ConfigError, match="x.limit must be >= 1, got 0"):
        check_range(Ranged(limit=0), "limit", ge=1, where="x.")
    with pytest.raises(TypeError, match="unknown bound"):
        bounded(1, min=0)
