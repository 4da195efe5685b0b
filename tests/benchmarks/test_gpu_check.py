"""benchmarks/gpu_check.py runs on a bare torch image: no Ray, faiss or pyarrow, CPU fallback."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
BLOCKED = ("ray", "faiss", "pyarrow")


def _blocking_path(tmp_path: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes every ``BLOCKED`` import fail."""
    blocker = tmp_path / "blocked"
    for name in BLOCKED:
        (blocker / name).mkdir(parents=True)
        (blocker / name / "__init__.py").write_text('raise ImportError("blocked for gpu_check")\n')
    return blocker


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


@pytest.mark.slow
def test_tiny_cpu_run_without_ray_faiss_pyarrow(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_blocking_path(tmp_path)), env.get("PYTHONPATH")) if p
    )
    args = ["--device", "cpu", "--sizes", "tiny", "--skip-compile", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout)
    assert result["device"] == "cpu"
    measurements = result["measurements"]
    assert set(measurements) == {"resnet50_train", "vit_b16_inference", "fct_transform"}
    rates = {
        "resnet50_train": "img_per_s",
        "vit_b16_inference": "img_per_s",
        "fct_transform": "rows_per_s",
    }
    for name, rate in rates.items():
        entry = measurements[name]
        assert entry["device"] == "cpu" and entry["dtype"] == "float32"
        assert entry[rate] > 0
        assert entry["batch_size"] > 0 and entry["iterations"] > 0
        assert entry["peak_gpu_memory_mb"] is None
    assert measurements["resnet50_train"]["compile"] == "skipped"


def test_compile_failure_is_reported_not_raised(gpu_check, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no backend here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken_compile)
    outcome = gpu_check.resnet50_compiled(
        torch.device("cpu"), torch.float32, gpu_check.SIZES["tiny"]
    )
    assert outcome == "failed: RuntimeError: no backend here"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda_is_an_error(gpu_check):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--device", "cuda", "--sizes", "tiny"])
    assert exit_info.value.code == 2
