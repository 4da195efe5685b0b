"""Untrusted files never run code: malicious checkpoints and dataset pickles are refused before
their payload executes, and the code base keeps every unpickling call restricted.

Each payload is an object whose ``__reduce__`` makes the unpickler call a function that creates a
marker file. Every refusal test also shows that the same bytes DO create the marker under an
unrestricted unpickler, so a passing test means "refused", not "payload broken".
"""

from __future__ import annotations

import ast
import io
import pickle
from pathlib import Path

import pytest
import s3fs
import torch

from raycompat.data.base import CorruptDataError
from raycompat.data.cifar import load_pickle
from raycompat.io.weights import load_state_dict
from tests.conftest import SessionLogs

ROOT = Path(__file__).resolve().parents[2]


class _OpensFile:
    """Unpickling calls ``open(marker, "w")``: a plain builtin, no ``exec`` needed."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _Execs:
    """Unpickling calls ``exec`` on source that creates the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _torch_bytes(obj, **kwargs) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def _checkpoints(marker: Path) -> dict[str, tuple[bytes, callable]]:
    """name -> (file bytes, the unrestricted loader that would run the payload)."""
    weights = {"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2)}
    unsafe_torch = lambda blob: torch.load(io.BytesIO(blob), weights_only=False)  # noqa: E731
    return {
        # A training checkpoint with the payload beside the weights.
        "trainer_checkpoint.pt": (
            _torch_bytes({"model": weights, "epoch": 3, "extra": _OpensFile(marker)}),
            unsafe_torch,
        ),
        # The payload hidden inside a list in the state dict itself.
        "nested.pt": (_torch_bytes({**weights, "meta": [1, _Execs(marker)]}), unsafe_torch),
        # torch's legacy (non-zip) serialisation.
        "legacy.pth": (
            _torch_bytes(
                {**weights, "x": _OpensFile(marker)}, _use_new_zipfile_serialization=False
            ),
            unsafe_torch,
        ),
        # A bare pickle with a checkpoint's name.
        "bare_pickle.bin": (pickle.dumps({"w": _Execs(marker)}, protocol=2), pickle.loads),
    }


@pytest.mark.parametrize(
    "name", ["trainer_checkpoint.pt", "nested.pt", "legacy.pth", "bare_pickle.bin"]
)
def test_malicious_checkpoint_is_refused_before_its_payload_runs(tmp_path, name):
    marker = tmp_path / "payload_ran"
    blob, unsafe_load = _checkpoints(marker)[name]
    path = tmp_path / name
    path.write_bytes(blob)
    with pytest.raises(pickle.UnpicklingError, match=rf"{name}: refused to load.*global"):
        load_state_dict(str(path))
    assert not marker.exists()
    # Control: the payload is live; an unrestricted unpickler runs it.
    unsafe_load(blob)
    assert marker.exists()


def test_pickle_named_safetensors_is_not_unpickled(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "model.safetensors"
    path.write_bytes(pickle.dumps({"w": _OpensFile(marker)}, protocol=2))
    with pytest.raises(ValueError, match=r"model\.safetensors: not a valid \.safetensors"):
        load_state_dict(str(path))
    assert not marker.exists()


def test_malicious_checkpoint_in_s3_is_refused(s3_bucket, tmp_path):
    bucket, storage_options = s3_bucket
    marker = tmp_path / "payload_ran"
    blob, _ = _checkpoints(marker)["trainer_checkpoint.pt"]
    uri = f"s3://{bucket}/raycompat/runs/evil/checkpoint.pt"
    s3fs.S3FileSystem(**storage_options).pipe(uri, blob)
    with pytest.raises(pickle.UnpicklingError, match=r"evil/checkpoint\.pt: refused to load"):
        load_state_dict(uri, storage_options=storage_options)
    assert not marker.exists()


def test_malicious_cifar_batch_is_refused(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "data_batch_1"
    blob = pickle.dumps({b"data": _Execs(marker), b"labels": [0]}, protocol=2)
    path.write_bytes(blob)
    with pytest.raises(
        CorruptDataError, match=r"data_batch_1: global __builtin__\.exec is not allowed"
    ):
        load_pickle(path)
    assert not marker.exists()
    pickle.loads(blob)
    assert marker.exists()


# ---------------------------------------------------------------- static guard


def _unsafe_calls(source: str) -> list[tuple[int, str]]:
    """Calls that would unpickle without restriction: ``torch.load`` without a literal
    ``weights_only=True``, ``pickle``/``cloudpickle``/``joblib`` ``load(s)``, ``np.load`` with
    ``allow_pickle=True``. Subclassed ``pickle.Unpickler`` with ``find_class`` is allowed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        name = f"{owner}.{node.func.attr}"
        keywords = {k.arg: k.value for k in node.keywords}

        def literal(key: str, kw=keywords):
            value = kw.get(key)
            return value.value if isinstance(value, ast.Constant) else None

        if (
            (name == "torch.load" and literal("weights_only") is not True)
            or name
            in {
                "pickle.load",
                "pickle.loads",
                "cloudpickle.load",
                "cloudpickle.loads",
                "joblib.load",
                "dill.load",
                "dill.loads",
            }
            or (name in {"np.load", "numpy.load"} and literal("allow_pickle") is True)
        ):
            found.append((node.lineno, name))
    return found


def test_guard_sees_unsafe_calls():
    source = (
        "torch.load(f)\ntorch.load(f, weights_only=False)\npickle.loads(b)\n"
        "np.load(p, allow_pickle=True)\ntorch.load(f, weights_only=True)\nnp.load(p)\n"
    )
    assert [name for _, name in _unsafe_calls(source)] == [
        "torch.load",
        "torch.load",
        "pickle.loads",
        "np.load",
    ]


def test_no_unrestricted_unpickling_in_the_code_base():
    files = sorted([*(ROOT / "raycompat").rglob("*.py"), *(ROOT / "jobs").rglob("*.py")])
    unsafe = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in _unsafe_calls(path.read_text())
    ]
    assert not unsafe, "unrestricted unpickling (use weights.load_state_dict):\n" + "\n".join(
        unsafe
    )


@pytest.mark.ray
@pytest.mark.slow
def test_credentials_never_reach_outputs_checkpoints_or_logs(
    ray_local, s3_bucket, s3_server, tmp_path, capfd, caplog
):
    """A full toy upgrade (initial model and gallery, then an FCT upgrade) with its store, its
    catalog and its training runs on S3, the credentials planted in ``store.storage_options``
    as well as in the environment: no file it wrote, locally, in the bucket or in Ray's session
    logs, and no line it printed or logged, contains the access key or the secret. The report's
    ``config.yaml`` says ``<redacted>`` instead, and the report files are private (0600)."""
    import importlib.util
    import logging
    import os
    import stat

    import yaml

    from raycompat.io.credentials import REDACTED

    caplog.set_level(logging.INFO)
    session = SessionLogs(ray_local)
    bucket, options = s3_bucket
    secrets = [os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]]
    assert secrets[0].startswith("AKIARAYCOMPAT")  # the distinctive fake values of conftest
    planted = {"key": secrets[0], "secret": secrets[1], "client_kwargs": options["client_kwargs"]}
    spec = importlib.util.spec_from_file_location(
        "upgrade_job", Path(__file__).parents[2] / "jobs" / "upgrade.py"
    )
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    config = tmp_path / "secrets.yaml"  # the user's own input: the one file allowed to hold them
    config.write_text(yaml.safe_dump({"store": {"storage_options": planted}}))
    summary = job.main(
        [
            "--config",
            str(config),
            "name=secrets",
            f"store.root=s3://{bucket}/store",
            "gallery_images.options={per_class: 40}",
            "training.data.options={per_class: 40}",
            "training.epochs=1",
            "training.eval={split: closed_set, test_classes: []}",
            f"training.run.storage_path=s3://{bucket}/runs",
            f"training.run.endpoint_url={s3_server}",
            "upgrades=[{model_version: m1, classes: 4, method: independent},"
            " {model_version: m2, classes: 10, method: fct,"
            " fct: {width: 32, epochs: 1, batch_size: 64}}]",
            "pipeline={rows_per_file: 200, batch_size: 200, actors: 1}",
            f"report_dir={tmp_path}/report",
            f"work_dir={tmp_path}/work",
        ]
    )
    assert summary["decisions"]["m1"] == "initial"
    fs = s3fs.S3FileSystem(**options)
    stored = fs.find(f"{bucket}/runs") + fs.find(f"{bucket}/store")
    assert any(p.endswith("model.safetensors") for p in stored)
    assert any("/_versions/v1.json" in p for p in stored)
    blobs = {}
    for path in stored:
        try:
            blobs[path] = fs.cat(path)
        except FileNotFoundError:  # a zero-byte "directory" marker the store client created
            continue
    assert len(blobs) >= 10
    v1 = next(data for path, data in blobs.items() if path.endswith("/_versions/v1.json"))
    assert b'"parameters"' in v1 and b'"by"' in v1  # the audit fields were searched too
    blobs |= session.written()  # what Ray's logs gained during this job, the workers' included
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != config and path.stat().st_size < 50_000_000:
            blobs[str(path)] = path.read_bytes()
    out, err = capfd.readouterr()
    blobs |= {"stdout": out.encode(), "stderr": err.encode(), "log": caplog.text.encode()}
    assert "summary:" in caplog.text  # the job's log was captured
    leaks = [p for p, data in blobs.items() if any(s.encode() in data for s in secrets)]
    assert not leaks, f"credentials found in {leaks[:5]}"
    # Not vacuous: the merged config was written, with the markers where the secrets were.
    report = tmp_path / "report" / "secrets"
    written = yaml.safe_load((report / "config.yaml").read_text())
    assert written["store"]["storage_options"] == {
        "key": REDACTED, "secret": REDACTED, "client_kwargs": options["client_kwargs"]
    }
    for name in ("config.yaml", "report.json", "report.md", "matrix.json"):
        assert stat.S_IMODE((report / name).stat().st_mode) == 0o600, name
