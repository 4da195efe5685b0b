"""raycompat.index.ivf: the sizes of an inverted file (nlist, default nprobe, coarse quantizer)."""

from __future__ import annotations

import pytest

from raycompat.index.ivf import HNSW_MIN_NLIST, ivf_nlist, ivf_nprobe, ivf_quantizer


def test_nlist_and_nprobe_rules():
    assert [ivf_nlist(n) for n in (1, 38, 100, 3000, 4000, 100_000)] == [1, 1, 2, 64, 64, 2048]
    assert [ivf_nlist(n) for n in (10**6, 4 * 10**6, 16 * 10**6, 10**9)] == [
        4096,
        8192,
        16384,
        65536,
    ]
    for n in [*range(1, 5000, 7), 10**5 + 3, 10**7 + 1]:
        nlist = ivf_nlist(n)
        assert nlist & (nlist - 1) == 0 and nlist <= 65536  # a power of two, capped
        assert nlist == 1 or n >= 39 * nlist  # at least 39 training rows per list
    assert [ivf_nprobe(n) for n in (1, 8, 64, 4096, 16384, 65536)] == [1, 8, 16, 64, 128, 256]


def test_auto_quantizer_is_hnsw_from_the_measured_threshold():
    assert ivf_quantizer(HNSW_MIN_NLIST // 2) == "flat"
    assert ivf_quantizer(HNSW_MIN_NLIST) == ivf_quantizer(65536) == "hnsw"
    assert ivf_quantizer(64, "hnsw") == "hnsw" and ivf_quantizer(65536, "flat") == "flat"
    with pytest.raises(ValueError, match="quantizer must be one of"):
        ivf_quantizer(64, "hnsw32")


@pytest.mark.parametrize(("kind", "nlist"), [("ivfpq", 16), ("ivfpq", 512), ("sharded_ivf", 512)])
def test_every_ivf_build_takes_its_default_nprobe_from_ivf_nprobe(kind, nlist):
    """One home for the default (issue 53, item 4): ``build_index`` of either IVF kind and a
    sharded build's plan (``raycompat.index.sharded.plan_build``, ``nprobe or ivf_nprobe``) all
    read :func:`ivf_nprobe`; 512 lists visit 32 (ivfpq once had its own ``min(nlist, 16)``)."""
    import numpy as np

    from raycompat.index.factory import build_index

    x = np.random.default_rng(0).normal(size=(2048, 8)).astype(np.float32)
    built = build_index(x, "l2", kind, nlist=nlist, use_gpu=False)
    assert built.index.nlist == nlist and built.index.nprobe == ivf_nprobe(nlist)
    assert ivf_nprobe(512) == 32
    given = build_index(x, "l2", kind, nlist=nlist, nprobe=3, use_gpu=False)
    assert given.index.nprobe == 3  # an explicit nprobe still wins
