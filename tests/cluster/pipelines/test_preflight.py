"""What ``jobs/transform.py`` checks before Ray starts (``cluster/pipelines/preflight.py``): an
extraction's target width against the exported model's (issue 23: a 2-d target for a 9-d model
failed only inside Ray, as a traceback)."""

from __future__ import annotations

import pytest
import torch

from raycompat.cluster.pipelines.preflight import check_inputs, check_model_width
from raycompat.config.pipelines import StoreSpec, TargetSpec, TransformJobConfig
from raycompat.config.train import ModelSpec
from raycompat.errors import ConfigError
from raycompat.store import GalleryStore
from raycompat.train.export import build_model, export_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """An exported LeNet++ with a fixed d-Simplex head over K=10 classes: 9-d features."""
    spec = ModelSpec(backbone="lenetpp", head="dsimplex", num_classes=10)
    directory = tmp_path_factory.mktemp("m1") / "m1"
    with torch.device("meta"):
        state = build_model(spec).state_dict()
    export_model(directory, {k: torch.zeros(v.shape) for k, v in state.items()}, spec)
    return str(directory)


def extract(model: str, width: int) -> TransformJobConfig:
    return TransformJobConfig(
        mode="extract",
        store=StoreSpec(root="unused", gallery="mnist"),
        model=model,
        target=TargetSpec(version="v1", model_version="m1", width=width, normalized=True),
    )


def test_the_model_width_fits(model_dir):
    check_model_width(model_dir, 9)
    check_inputs(extract(model_dir, 9), GalleryStore("unused"))  # an extraction reads no store


def test_another_width_is_one_line_naming_the_key_and_both_widths(model_dir):
    with pytest.raises(ConfigError) as caught:
        check_inputs(extract(model_dir, 2), GalleryStore("unused"))
    assert str(caught.value) == (
        f"target.width: 2, but model {model_dir} embeds 9-d features "
        "(its model.json: lenetpp + dsimplex); set target.width=9"
    )


def test_a_transform_target_of_another_width_than_h_is_one_line(tmp_path):
    from raycompat.store import VersionInfo, embedding_table
    from raycompat.transformations import FCTTransformation, save_transformation

    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", 8, False, "v1"), "init")
    staging.write_table(embedding_table([0, 1], torch.ones(2, 8).numpy()), "p.parquet")
    staging.commit(expected_rows=2)
    save_transformation(tmp_path / "h", FCTTransformation(8, 0, 4, width=16), "h")
    cfg = TransformJobConfig(
        mode="transform",
        store=StoreSpec(root=store.root, gallery="g"),
        source_version="v1",
        transformation=str(tmp_path / "h"),
        target=TargetSpec(version="v2", model_version="m2", width=4),
    )
    check_inputs(cfg, store)
    cfg.target.width = 6
    with pytest.raises(ConfigError, match=r"^target.width: 6, but transformation .*/h maps to 4-d"):
        check_inputs(cfg, store)
