"""End-to-end: the MNIST-5k compatibility demo, the way `make demo` runs it (tiny settings, on
a quarter of MNIST-5k)."""

import importlib
import json
import logging
import re

import numpy as np
import pytest

from raycompat.cli.demo import main
from raycompat.errors import ConfigError

pytestmark = pytest.mark.slow


@pytest.fixture
def quarter_of_mnist5k(monkeypatch):
    """The demo reads every 4th MNIST-5k image (1,250, every digit): training dominates its
    time, and the outputs it checks do not depend on how many images there are."""
    demo = importlib.import_module(main.__module__)
    images, labels = demo.load_mnist5k()
    monkeypatch.setattr(demo, "load_mnist5k", lambda: (images[::4], labels[::4]))


def test_demo_runs_and_writes_outputs(tmp_path, quarter_of_mnist5k, caplog):
    out = tmp_path / "demo"
    with caplog.at_level(logging.INFO, logger="raycompat"):
        results = main(["epochs=1", "steps=[2, 3]", "batch_size=128", f"output_dir={out}"])
    # each model's training announced before it starts, numbered, with an ETA once one is done
    announced = [r.getMessage() for r in caplog.records if r.name == "raycompat.progress"]
    assert [line.split(":")[0] for line in announced] == [
        f"[{2 * i + (step or 2)}/6] {method}{f' step {step}' if step else ''}"
        for i, method in enumerate(["ift", "bct", "cores"])
        for step in (1, 2, 0)
    ]
    assert re.fullmatch(
        r"\[1/6\] ift step 1: training on 2 digits \(\d+ images\), 1 epoch", announced[0]
    )
    assert "| ETA " in announced[1] and "| ETA " in announced[-1]
    assert set(results) == {"ift", "bct", "cores"}
    for name, per_set in results.items():
        assert set(per_set) == {"seen", "all"}
        result = per_set["all"]
        matrix = np.array(result["matrix"])
        assert matrix.shape == (2, 2) and matrix[0, 1] == 0.0
        assert 0.0 <= result["AC"] <= 1.0
        assert result["AA"] == pytest.approx((matrix[0, 0] + matrix[1, 0] + matrix[1, 1]) / 3)
        assert (out / f"features_{name}.png").stat().st_size > 10_000
    assert json.loads((out / "results.json").read_text()) == results
    assert "steps:" in (out / "config.yaml").read_text()


def test_demo_rejects_bad_settings(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key"):
        main(["epoch=1"])
    with pytest.raises(ValueError, match="steps must grow"):
        main(["steps=[7, 4]", f"output_dir={tmp_path}"])
