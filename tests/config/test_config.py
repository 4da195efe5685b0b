"""Typed config loading: defaults -> file -> overrides; unknown keys and wrong types rejected."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from raycompat.config import load_config, parse_overrides, save_config
from raycompat.errors import ConfigError


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
    from raycompat.config.train import TrainConfig

    base = load_config(TrainConfig, None, ["epochs=2"])
    changed = apply_overrides(base, ["optim.lr=0.5", "method_options.lam=0.2"])
    assert (changed.epochs, changed.optim.lr, changed.method_options) == (2, 0.5, {"lam": 0.2})
    assert base.optim.lr != 0.5  # the original is untouched
    with pytest.raises(ConfigError, match="optim.lrr"):
        apply_overrides(base, ["optim.lrr=0.5"])


def test_exponent_floats_without_a_dot_are_floats_everywhere(tmp_path):
    """YAML 1.1 reads 3e-5 as a string; a config, an override and a sampled sweep value
    (json.dumps(3e-05) == "3e-05") all mean the float."""
    from raycompat.cluster.tune.space import trial_overrides
    from raycompat.config.train import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-4}\nmethod_options: {lam: 5E-1}\n")
    cfg = load_config(TrainConfig, path, ["optim.weight_decay=3e-5"])
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 3e-5
    assert cfg.method_options == {"lam": 0.5}
    sampled = load_config(TrainConfig, None, trial_overrides({"optim.lr": 3.2e-05}))
    assert sampled.optim.lr == 3.2e-05
    assert load_config(TrainConfig, None, ["run.name=1e5x"]).run.name == "1e5x"


# ---------------------------------------------------------------------------- ranges
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("epochs", [0, -3])
def test_train_epochs_below_one_are_refused_at_load_time(tmp_path, epochs):
    from raycompat.config.train import TrainConfig

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
    from raycompat.config.train import TrainConfig

    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        load_config(TrainConfig, None, [override])
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        apply_overrides(TrainConfig(), [override])  # a sweep's sampled values too


@pytest.mark.parametrize("epochs", [0, -3])
def test_upgrade_job_refuses_training_epochs_below_one_before_running(epochs):
    """``training.epochs=0`` used to publish a gallery extracted by an untrained model."""
    import importlib.util

    from raycompat.config.upgrade import UpgradeConfig

    with pytest.raises(ConfigError, match=rf"training.epochs must be >= 1, got {epochs}"):
        load_config(UpgradeConfig, None, [f"training.epochs={epochs}"])
    spec = importlib.util.spec_from_file_location("upgrade_job", ROOT / "jobs" / "upgrade.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    with pytest.raises(ConfigError, match=rf"training.epochs must be >= 1, got {epochs}"):
        job.main([f"training.epochs={epochs}"])  # refused while loading, before Ray starts


def test_upgrade_entry_epochs_and_python_built_configs_are_checked():
    import dataclasses

    from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config

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


TRAIN_RANGES = [
    ("model.num_classes=0", "model.num_classes must be >= 1, got 0"),
    ("model.embed_dim=0", "model.embed_dim must be >= 1, got 0"),
    ("data.num_loader_workers=-1", "data.num_loader_workers must be >= 0, got -1"),
    ("data.decode_actors=0", "data.decode_actors must be >= 1, got 0"),
    ("eval.test_fraction=1.5", "eval.test_fraction must be < 1.0, got 1.5"),
    ("eval.test_fraction=0", "eval.test_fraction must be > 0.0, got 0.0"),
    ("eval.val_fraction=-0.1", "eval.val_fraction must be >= 0.0, got -0.1"),
    ("eval.val_fraction=1", "eval.val_fraction must be < 1.0, got 1.0"),
    ("eval.pairs=0", "eval.pairs must be >= 1, got 0"),
    ("eval.batch_size=0", "eval.batch_size must be >= 1, got 0"),
    ("optim.lr=-5", "optim.lr must be > 0.0, got -5.0"),
    ("optim.momentum=1", "optim.momentum must be < 1.0, got 1.0"),
    ("optim.momentum=-0.5", "optim.momentum must be >= 0.0, got -0.5"),
    ("optim.weight_decay=-1e-4", "optim.weight_decay must be >= 0.0, got -0.0001"),
    ("optim.gamma=0", "optim.gamma must be > 0.0, got 0.0"),
    ("optim.warmup_epochs=-1", "optim.warmup_epochs must be >= 0, got -1"),
    ("optim.clip_grad_norm=0", "optim.clip_grad_norm must be > 0.0, got 0.0"),
    ("scenario.replay_per_class=-1", "scenario.replay_per_class must be >= 0, got -1"),
    (
        "scenario.replacements=[{at_task: -1}]",
        "scenario.replacements[0].at_task must be >= 0, got -1",
    ),
    (
        "scenario.replacements=[{at_task: 1, epochs: -1}]",
        "scenario.replacements[0].epochs must be >= 0, got -1",
    ),
    ("scenario.old_model={classes: -2}", "scenario.old_model.classes must be >= 0, got -2"),
    ("scaling.num_workers=0", "scaling.num_workers must be >= 1, got 0"),
    ("scaling.cpus_per_worker=-1", "scaling.cpus_per_worker must be >= 0.0, got -1.0"),
    ("run.max_failures=-2", "run.max_failures must be >= -1, got -2"),
    ("run.checkpoints_to_keep=0", "run.checkpoints_to_keep must be >= 1, got 0"),
    ("run.inject_failure={epoch: -1}", "run.inject_failure.epoch must be >= 0, got -1"),
    ("seed=-1", "seed must be >= 0, got -1"),
]


@pytest.mark.parametrize(("override", "message"), TRAIN_RANGES)
def test_training_ranges_name_the_key(override, message):
    import re

    from raycompat.config import apply_overrides
    from raycompat.config.train import TrainConfig
    from raycompat.config.upgrade import UpgradeConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(TrainConfig, None, [override])
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(TrainConfig(), [override])  # a sweep's sampled values too
    with pytest.raises(ConfigError, match=re.escape(f"training.{message}")):
        load_config(UpgradeConfig, None, [f"training.{override}"])


def test_special_values_stay_legal():
    """0 or -1 where they mean "off" or "unlimited"; None where unset."""
    from raycompat.config.train import TrainConfig

    cfg = load_config(
        TrainConfig,
        None,
        [
            "eval.val_fraction=0",
            "scenario.replay_per_class=0",
            "run.max_failures=-1",
            "run.max_failures=0",
            "data.num_loader_workers=0",
            "optim.momentum=0",
            "optim.weight_decay=0",
            "optim.clip_grad_norm=null",
            "scenario.replacements=[{at_task: 1, epochs: 0}]",
        ],
    )
    assert cfg.optim.clip_grad_norm is None and cfg.scenario.replacements[0].epochs == 0
    assert load_config(TrainConfig, None, ["optim.clip_grad_norm=1"]).optim.clip_grad_norm == 1.0


UPGRADE_RANGES = [
    ("upgrades=[{model_version: a, classes: 0}]", "upgrades[0].classes must be >= 1, got 0"),
    ("upgrades=[{model_version: a, classes: 2, fct: {width: 0}}]", "fct.width must be >= 1"),
    ("upgrades=[{model_version: a, classes: 2, fct: {epochs: 0}}]", "fct.epochs must be >= 1"),
    (
        "upgrades=[{model_version: a, classes: 2, fct: {batch_size: 0}}]",
        "upgrades[0].fct.batch_size must be >= 1, got 0",
    ),
    (
        "upgrades=[{model_version: a, classes: 2, fct: {optim: {lr: 0}}}]",
        "upgrades[0].fct.optim.lr must be > 0.0, got 0.0",
    ),
    (
        "upgrades=[{model_version: a, classes: 2, fct: {optim: {weight_decay: -1}}}]",
        "upgrades[0].fct.optim.weight_decay must be >= 0.0, got -1.0",
    ),
    (
        "upgrades=[{model_version: a, classes: 2, fct: {optim: {momentum: 1}}}]",
        "upgrades[0].fct.optim.momentum must be < 1.0, got 1.0",
    ),
    (
        "upgrades=[{model_version: a, classes: 2, fct: {optim: {warmup_epochs: -1}}}]",
        "upgrades[0].fct.optim.warmup_epochs must be >= 0, got -1",
    ),
]


@pytest.mark.parametrize(("override", "message"), UPGRADE_RANGES)
def test_upgrade_ranges_name_the_key(override, message):
    import re

    from raycompat.config.upgrade import UpgradeConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(UpgradeConfig, None, [override])


FCT_RANGES = [
    ("SideInfoTrainConfig", "temperature=0", "temperature must be > 0.0, got 0.0"),
    ("SideInfoTrainConfig", "crop_scale=1.5", "crop_scale must be <= 1.0, got 1.5"),
    ("SideInfoTrainConfig", "crop_scale=0", "crop_scale must be > 0.0, got 0.0"),
    ("SideInfoTrainConfig", "epochs=0", "epochs must be >= 1, got 0"),
    ("SideInfoTrainConfig", "batch_size=0", "batch_size must be >= 1, got 0"),
    ("SideInfoTrainConfig", "model.embed_dim=0", "model.embed_dim must be >= 1, got 0"),
    ("SideInfoTrainConfig", "model.projection_dim=0", "model.projection_dim must be >= 1"),
    ("SideInfoTrainConfig", "optim.lr=-1", "optim.lr must be > 0.0, got -1.0"),
    ("SideInfoTrainConfig", "seed=-3", "seed must be >= 0, got -3"),
    ("TransformationTrainConfig", "h.d_old=0", "h.d_old must be >= 1, got 0"),
    ("TransformationTrainConfig", "h.d_side=-1", "h.d_side must be >= 0, got -1"),
    ("TransformationTrainConfig", "h.width=0", "h.width must be >= 1, got 0"),
    ("TransformationTrainConfig", "g={d_side_new: 0}", "g.d_side_new must be >= 1, got 0"),
    ("TransformationTrainConfig", "epochs=0", "epochs must be >= 1, got 0"),
    ("TransformationTrainConfig", "batch_size=0", "batch_size must be >= 1, got 0"),
]


@pytest.mark.parametrize(("cls", "override", "message"), FCT_RANGES)
def test_fct_training_ranges_name_the_key(cls, override, message):
    import re

    from raycompat.config import fct as fct_config

    base = ["triples=t", "h={d_old: 8, d_side: 0, d_new: 8}"]
    overrides = [*base, override] if cls == "TransformationTrainConfig" else [override]
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(getattr(fct_config, cls), None, overrides)
    if cls == "TransformationTrainConfig":
        assert load_config(fct_config.TransformationTrainConfig, None, base).h.d_side == 0


def test_an_unknown_key_suggests_the_nearest_in_the_file_and_in_an_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  epochz: 1\n")
    with pytest.raises(
        ConfigError, match=r"^\S*c.yaml: .*optim.epochz;.*did you mean 'optim.epochs'\?$"
    ):
        load_config(Job, path)
    with pytest.raises(
        ConfigError, match=r"unknown config key\(s\) nmae; .*did you mean 'name'\?$"
    ):
        load_config(Job, None, ["nmae=x"])
    with pytest.raises(ConfigError, match=r"valid keys here: [^;]*$"):  # nothing close: no hint
        load_config(Job, None, ["zzzz=1"])


def test_a_missing_config_file_suggests_the_nearest_in_its_folder(tmp_path):
    (tmp_path / "upgrade_mnist.yaml").write_text("name: x\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError) as missing:
        load_config(Job, tmp_path / "upgrad.yaml")
    near = tmp_path / "upgrade_mnist.yaml"
    assert (
        str(missing.value)
        == f"config file {tmp_path / 'upgrad.yaml'} does not exist; did you mean {str(near)!r}?"
    )
    with pytest.raises(FileNotFoundError, match=r"nope/x.yaml does not exist$"):  # no folder
        load_config(Job, tmp_path / "nope" / "x.yaml")


def test_a_maps_budget_is_pairs_or_a_fraction_of_the_rows_never_both():
    from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config, decision_digest

    def entry(*overrides: str):
        cfg = load_config(UpgradeConfig, None, ["upgrades.1.method=procrustes", *overrides])
        cfg.upgrades[1].method_options = {}  # the default entry's are d-Simplex's
        check_upgrade_config(cfg)
        return cfg, cfg.upgrades[1]

    cfg, default = entry()
    assert default.map.budget() == {"pairs": 5000} and default.map.describe() == "5000 pairs"
    _, share = entry("upgrades.1.map.pairs_fraction=0.01")
    assert share.map.budget() == {"fraction": 0.01}
    assert share.map.describe() == "a 1% sample of the rows"
    # the default written out judges the same entry (digests of configs before the fraction)
    explicit_cfg, explicit = entry("upgrades.1.map.pairs=5000")
    digest = decision_digest(cfg, default, "m1")
    assert decision_digest(explicit_cfg, explicit, "m1") == digest
    share_cfg, share = entry("upgrades.1.map.pairs_fraction=0.01")
    assert decision_digest(share_cfg, share, "m1") != digest
    with pytest.raises(ConfigError) as err:
        entry("upgrades.1.map.pairs=100", "upgrades.1.map.pairs_fraction=0.5")
    assert str(err.value) == (
        "upgrades[1].map: pairs=100 and pairs_fraction=0.5 are both set; give one"
    )
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"upgrades\[1\].map.pairs_fraction must be"):
            entry(f"upgrades.1.map.pairs_fraction={bad}")


@pytest.mark.parametrize(
    "text,where,problem",
    [
        ("name: x\noptim:\n  lr: [1\n", "line 4, column 1", "expected ',' or ']'"),
        ("name: x\n  method: bct\n", "line 2, column 9", "mapping values are not allowed here"),
        ('name: "x\n', "line 2, column 1", "found unexpected end of stream"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(
    tmp_path, text, where, problem
):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(Job, path)
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{path}: {where}: YAML syntax error: {problem}")


def test_a_yaml_syntax_error_in_an_override_names_the_override():
    with pytest.raises(ConfigError) as error:
        load_config(Job, None, ["seeds=[1, 2"])
    (line,) = str(error.value).splitlines()
    assert line.startswith("override 'seeds=[1, 2': line 1, column 6: YAML syntax error: ")
    assert "(while parsing a flow sequence started at line 1, column 1)" in line


def test_a_mistyped_choice_suggests_the_nearest(tmp_path):
    with pytest.raises(ConfigError, match=r"method: 'bctt' is not one of .*did you mean 'bct'\?$"):
        load_config(Job, None, ["method=bctt"])
    with pytest.raises(ConfigError, match=r"is not one of 'ift', 'bct'$"):  # nothing close
        load_config(Job, None, ["method=zzzz"])
    from raycompat.config.upgrade import UpgradeConfig

    with pytest.raises(
        ConfigError, match=r"policy.on_incompatible: 'backfil' .*did you mean 'backfill'\?$"
    ):
        load_config(UpgradeConfig, None, ["policy.on_incompatible=backfil"])
