"""Weight files: local and S3 (moto server), safetensors and torch, nesting, refusal of
malicious pickles, and the errors a user sees for missing files, bad credentials and mismatches."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import s3fs
import torch
from safetensors.torch import save as safetensors_bytes

from raycompat.io.weights import (
    WeightsMismatchError,
    load_state_dict,
    load_weights,
    open_uri,
)
from raycompat.nn.backbones import create_backbone


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dino_source():
    """Trunk state dict of a seeded, randomly initialised DINOv3 ViT-S/16 and both file forms."""
    torch.manual_seed(1)
    model = create_backbone("dinov3_vits16", img_size=32)
    state = {k: v.clone() for k, v in model.trunk.state_dict().items()}
    return model, state, {".safetensors": safetensors_bytes(state), ".pt": _torch_bytes(state)}


@pytest.fixture(scope="module")
def dino_target(dino_source):
    """A copy (cheaper than a second ViT init) that every test zeroes before loading into it."""
    return copy.deepcopy(dino_source[0])


def _assert_trunk_equals(model, state):
    loaded = model.trunk.state_dict()
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key


def _scramble(model):
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_dinov3_weights_from_local_file(tmp_path, dino_source, dino_target, suffix):
    _, state, blobs = dino_source
    path = tmp_path / f"dinov3_vits16{suffix}"
    path.write_bytes(blobs[suffix])
    _scramble(dino_target)
    dino_target.load_trunk_weights(str(path))
    _assert_trunk_equals(dino_target, state)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_dinov3_weights_from_s3(s3_bucket, dino_source, dino_target, suffix):
    bucket, storage_options = s3_bucket
    _, state, blobs = dino_source
    uri = f"s3://{bucket}/weights/dinov3_vits16{suffix}"
    s3fs.S3FileSystem(**storage_options).pipe(uri, blobs[suffix])
    _scramble(dino_target)
    dino_target.load_trunk_weights(uri, storage_options=storage_options)
    _assert_trunk_equals(dino_target, state)


def test_dinov3_builder_weights_option_reads_s3(s3_bucket, dino_source):
    bucket, storage_options = s3_bucket
    _, state, blobs = dino_source
    uri = f"s3://{bucket}/dinov3.safetensors"
    s3fs.S3FileSystem(**storage_options).pipe(uri, blobs[".safetensors"])
    torch.manual_seed(3)
    model = create_backbone("dinov3_vits16", img_size=32, embed_dim=6, weights=uri,
                            storage_options=storage_options)
    _assert_trunk_equals(model, state)
    assert model.embed_dim == 6


def test_meta_dinov3_checkpoint_names_are_converted(tmp_path, dino_source, dino_target):
    _, state, _ = dino_source
    renames = (("reg_token", "storage_tokens"), ("gamma_1", "ls1.gamma"),
               ("gamma_2", "ls2.gamma"))
    meta = {}
    for key, value in state.items():
        for timm_name, meta_name in renames:
            key = key.replace(timm_name, meta_name)
        meta[key] = value
    meta["mask_token"] = torch.zeros(1, state["cls_token"].shape[-1])  # pretraining only
    path = tmp_path / "dinov3_vits16_pretrain.pth"
    path.write_bytes(_torch_bytes({"model": meta}))
    _scramble(dino_target)
    dino_target.load_trunk_weights(str(path))
    _assert_trunk_equals(dino_target, state)


def test_nesting_and_module_prefix_are_unwrapped(tmp_path):
    weight = torch.arange(6.0).reshape(2, 3)
    path = tmp_path / "ckpt.pt"
    path.write_bytes(_torch_bytes(
        {"epoch": 7, "model": {"state_dict": {"module.fc.weight": weight}}}))
    state = load_state_dict(str(path))
    assert list(state) == ["fc.weight"]
    assert torch.equal(state["fc.weight"], weight)


def test_non_tensor_entry_is_named(tmp_path):
    path = tmp_path / "bad.pt"
    path.write_bytes(_torch_bytes({"fc.weight": torch.zeros(1), "fc.note": "hello"}))
    with pytest.raises(ValueError, match=r"bad\.pt.*'fc\.note'.*not a tensor"):
        load_state_dict(str(path))


def test_corrupt_safetensors_names_the_file(tmp_path):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ValueError, match=r"broken\.safetensors.*not a valid \.safetensors"):
        load_state_dict(str(path))


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "code_ran"
    blob = _torch_bytes({"fc.weight": torch.zeros(2), "payload": _RunsCode(str(marker))})
    path = tmp_path / "evil.pt"
    path.write_bytes(blob)
    with pytest.raises(pickle.UnpicklingError, match=r"evil\.pt.*refused.*weights_only=True"):
        load_state_dict(str(path))
    assert not marker.exists()
    # The payload is live: an unrestricted unpickler does run it.
    torch.load(io.BytesIO(blob), weights_only=False)
    assert marker.exists()


def test_missing_local_file_says_what_to_do(tmp_path):
    path = tmp_path / "nowhere" / "weights.safetensors"
    with pytest.raises(FileNotFoundError, match=r"nowhere/weights\.safetensors.*s3://.*"
                       r"nothing is downloaded"):
        load_state_dict(str(path))


@pytest.mark.parametrize("where", ["missing-key", "missing-bucket"])
def test_missing_s3_object_says_what_to_do(s3_bucket, where):
    bucket, storage_options = s3_bucket
    if where == "missing-bucket":
        bucket = f"{bucket}-absent"
    uri = f"s3://{bucket}/ckpt/weights.pt"
    with pytest.raises(FileNotFoundError, match=rf"{uri}.*nothing is downloaded"):
        load_state_dict(uri, storage_options=storage_options)


def test_wrong_credentials_name_the_object_and_hide_the_secret(s3_bucket, s3_strict_auth):
    bucket, storage_options = s3_bucket
    uri = f"s3://{bucket}/w.pt"
    with open_uri(uri, "wb", dict(storage_options, **s3_strict_auth)) as f:
        f.write(_torch_bytes({"w": torch.ones(3)}))
    good = dict(storage_options, skip_instance_cache=True, **s3_strict_auth)
    assert torch.equal(load_state_dict(uri, good)["w"], torch.ones(3))
    bad_secret = "not-the-secret-1234"
    bad = dict(good, secret=bad_secret)
    with pytest.raises(PermissionError, match=rf"{uri}.*credentials") as info:
        load_state_dict(uri, bad)
    assert bad_secret not in str(info.value)


def _small(seed: int, embed_dim: int):
    torch.manual_seed(seed)
    return create_backbone("cifar_resnet20", embed_dim=embed_dim)


def test_load_weights_roundtrip_and_mismatch_errors(tmp_path):
    source = _small(0, 5)
    path = tmp_path / "r20.safetensors"
    path.write_bytes(safetensors_bytes(source.state_dict()))
    target = _small(1, 5)
    load_weights(target, str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key

    with pytest.raises(WeightsMismatchError, match=r"r20\.safetensors.*shape mismatches.*"
                       r"embedding\.weight: file \(5, 64\) vs model \(6, 64\)"):
        load_weights(_small(0, 6), str(path))

    partial = {k: v for k, v in source.state_dict().items() if k != "embedding.bias"}
    partial["extra.weight"] = torch.zeros(1)
    path2 = tmp_path / "partial.pt"
    path2.write_bytes(_torch_bytes(partial))
    with pytest.raises(WeightsMismatchError, match=r"partial\.pt.*1 missing keys \(first: "
                       r"embedding\.bias\).*1 unexpected keys \(first: extra\.weight\)"):
        load_weights(_small(1, 5), str(path2))
    result = load_weights(_small(1, 5), str(path2), strict=False)
    assert result.missing_keys == ["embedding.bias"]
    assert result.unexpected_keys == ["extra.weight"]
