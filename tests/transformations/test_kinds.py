"""The registry of transformation kinds (raycompat/transformations/kinds.py) and the interface
every kind implements (base.py)."""

import subprocess
import sys

import pytest
import torch

from raycompat.errors import UsageError
from raycompat.registry import UnknownNameError
from raycompat.transformations import (
    INTERFACE_KEYS,
    TRANSFORMATIONS,
    AdapterTransformation,
    AffineTransformation,
    FCTTransformation,
    ProcrustesTransformation,
    SlerpTransformation,
    Transformation,
    create_transformation,
    list_transformations,
    transformation_class,
)

# Small constructor specs of every kind (widths 5 -> 3, side-information of 2 where taken).
SPECS = {
    "fct": dict(d_old=5, d_side=2, d_new=3, width=8, normalize_output=False),
    "procrustes": dict(d_old=5, d_side=0, d_new=3, normalize_output=False),
    "affine": dict(d_old=5, d_side=0, d_new=3, normalize_output=True),
    "adapter": dict(d_old=5, d_side=0, d_new=3, width=8, normalize_output=False),
    "slerp": dict(d_old=5, d_side=0, d_new=3, normalize_output=True),
}


def test_every_kind_has_a_small_spec_here():
    assert sorted(SPECS) == list_transformations()


def test_lookup_gives_the_kind_class():
    assert "fct" in TRANSFORMATIONS
    assert transformation_class("fct") is FCTTransformation
    assert transformation_class("procrustes") is ProcrustesTransformation
    assert transformation_class("affine") is AffineTransformation
    assert transformation_class("adapter") is AdapterTransformation
    assert transformation_class("slerp") is SlerpTransformation


def test_an_unknown_kind_lists_the_kinds():
    with pytest.raises(UnknownNameError, match=r"unknown transformation kind 'procrustez'") as err:
        create_transformation("procrustez", d_old=4)
    assert isinstance(err.value, UsageError)
    assert "valid names: " + ", ".join(list_transformations()) in str(err.value)


@pytest.mark.parametrize("kind", TRANSFORMATIONS.names())
def test_every_kind_implements_the_interface(kind):
    cls = transformation_class(kind)
    assert issubclass(cls, Transformation) and cls.kind == kind
    assert set(INTERFACE_KEYS) <= set(cls.spec_keys)
    torch.manual_seed(0)
    h = create_transformation(kind, **SPECS[kind]).eval()
    assert (h.d_old, h.d_side, h.d_new) == (5, SPECS[kind]["d_side"], 3)
    spec = h.spec()
    assert set(spec) == set(cls.spec_keys) | set(cls.spec_defaults)
    assert cls.args_of(spec) == spec and cls.missing_keys(spec) == []
    out = h(torch.randn(4, 5), torch.randn(4, 2) if h.d_side else None)
    assert out.shape == (4, 3) and torch.isfinite(out).all()


def test_a_kind_without_the_interface_keys_is_refused():
    with pytest.raises(TypeError, match=r"spec_keys lacks the interface keys \['d_side'"):

        class Narrow(Transformation):
            kind = "narrow"
            spec_keys = ("d_old", "d_new", "normalize_output")


def test_listing_the_kinds_imports_no_torch():
    code = (
        "import sys; from raycompat.transformations import list_transformations; "
        "assert list_transformations(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind", ["procrustes", "affine", "adapter", "slerp"])
def test_map_arrays_is_forward_on_arrays_for_every_query_side_kind(kind):
    """What a query-side search runs (the linear kinds' own lean call, the adapter's module
    call), float64 queries included."""
    import numpy as np

    torch.manual_seed(0)
    h = create_transformation(kind, **SPECS[kind])
    if hasattr(h, "set_weights"):
        rng = np.random.default_rng(0)
        h.set_weights(rng.normal(size=(5, 3)), rng.normal(size=3))
    x = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    with torch.no_grad():
        want = h(torch.from_numpy(x)).numpy()
    got = h.map_arrays(x)
    assert got.dtype == np.float32 and got.shape == (4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.map_arrays(x.astype(np.float64)), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"shape \(N, 5\), got \(4, 4\)"):
        h.map_arrays(x[:, :4])
