"""Every YAML under configs/ names the command that runs it, parses, and fits the code.

Nothing is trained: configs are loaded into their dataclass, their registered names are looked
up, their scenario is planned, and every model they describe is built on the meta device (no
memory, no weights), so a typo in a 16-GPU config fails here rather than on the cluster.
"""

from pathlib import Path

import pytest
import torch
import yaml

from raycompat.cli.demo import DemoConfig
from raycompat.cluster.tune.fct import check_transformation, split_params, transformation_of
from raycompat.cluster.tune.space import param_space, trial_overrides
from raycompat.cluster.tune.sweep import check_asha
from raycompat.config import load_config
from raycompat.config.pipelines import TransformJobConfig
from raycompat.config.serve import ServeJobConfig
from raycompat.config.train import TrainConfig
from raycompat.config.tune import SweepConfig
from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config
from raycompat.data import DATASETS
from raycompat.data.augment import AUGMENTATIONS
from raycompat.index.distances import DISTANCES
from raycompat.methods import METHODS
from raycompat.methods.catalog import check_method_options
from raycompat.parallel import STRATEGIES
from raycompat.train.export import build_model
from raycompat.train.scenarios import plan_steps


def check_sweep(sweep: SweepConfig) -> None:
    """The base config and every grid point's config load; the space builds."""
    param_space(sweep.space)
    base = load_config(TrainConfig, sweep.base, sweep.overrides)
    check_transformation(sweep, base)
    check_asha(sweep, base)
    grids = [s for s in sweep.space if s.kind == "grid"]
    for spec in grids or sweep.space[:1]:
        for value in spec.values or [spec.low]:
            training, _ = split_params({spec.key: value})
            cfg = load_config(
                TrainConfig, sweep.base, [*sweep.overrides, *trial_overrides(training)]
            )
            check_method_options(cfg.method, cfg.method_options)
            plan_steps(cfg)
            transformation_of(sweep, {spec.key: value})


CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
COMMANDS = {
    "python jobs/train.py": TrainConfig,
    "python jobs/tune.py": SweepConfig,
    "python -m raycompat.cli.demo": DemoConfig,
    "python jobs/transform.py": TransformJobConfig,
    "python jobs/upgrade.py": UpgradeConfig,
    "python jobs/deploy.py": ServeJobConfig,
}


def config_class(path: Path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# Run: "), f"{path.name}: first line must be '# Run: <command>'"
    for command, cls in COMMANDS.items():
        if command in first and f"--config configs/{path.name}" in first:
            return cls
    raise AssertionError(f"{path.name}: the run command does not name a known job and itself")


def test_there_are_configs_for_every_scenario_of_the_papers():
    names = {p.stem for p in CONFIGS}
    assert {
        "train_mnist_cores",
        "train_cifar100_cores",
        "train_cifar100_cl2r",
        "train_casia_cores",
        "train_celeba_iam_cl2r",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_matches_the_code(path):
    cls = config_class(path)
    cfg = load_config(cls, path)
    assert isinstance(yaml.safe_load(path.read_text()), dict)
    if cls is SweepConfig:
        check_sweep(cfg)
        return
    if cls is UpgradeConfig:
        check_upgrade_config(cfg)
        cfg = cfg.training
    elif cls is not TrainConfig:
        return
    for name, registry in (
        (cfg.method, METHODS),
        (cfg.first_method, METHODS),
        (cfg.data.name, DATASETS),
        (cfg.data.augment, AUGMENTATIONS),
        (cfg.scaling.strategy, STRATEGIES),
        (cfg.eval.distance, DISTANCES),
    ):
        registry.get(name)
    plans = plan_steps(cfg)
    assert plans
    with torch.device("meta"):
        for spec in {id(p.model): p.model for p in plans}.values():
            model = build_model(spec)
            assert model.num_classes == spec.num_classes
    check_method_options(cfg.method, cfg.method_options)
