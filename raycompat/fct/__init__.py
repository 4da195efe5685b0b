"""FCT, the method (Ramanujan et al., CVPR 2022): train the side-information model ``psi`` and
the transformation ``h`` (and the optional ``g``) that the forward-transform pipelines apply.

The transformation itself is a kind of :mod:`raycompat.transformations` (``"fct"``: the MLP,
its files); this package is how FCT fits it. It imports nothing at load time (its names load
at their first use), so its Ray-free modules stay cheap to import:

- :mod:`raycompat.config.fct`: typed configs (``FCTSpec``, ``TransformationTrainConfig``, ...),
  read by the upgrade and Tune configs before Ray starts;
- :mod:`raycompat.fct.losses`: ``h``'s MSE and FastFill's uncertainty-weighted loss, BN freezing;
- :mod:`raycompat.fct.checks`: the checks run before a run starts (sources, widths, triples);
- :mod:`raycompat.fct.triples`: ``(phi_old, psi, phi_new)`` of a training set, in process;
- :mod:`raycompat.fct.export`: save and load ``psi`` as safetensors + JSON;
- :mod:`raycompat.fct.pair`: ``h`` and ``g`` as the one module a transformation run trains;
- :mod:`raycompat.cluster.train.fct_fit`: fit ``h`` from arrays (Ray Train when called) and apply
  it;
- :mod:`raycompat.cluster.train.fct_loop`: the Ray Train V2 runs (Ray layer), on the per-worker
  skeleton shared with model training (:mod:`raycompat.cluster.train.worker`).
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "losses": (
            "freeze_batchnorm_statistics",
            "transformation_loss",
            "uncertain_transformation_loss",
        ),
        "export": ("export_side_info", "load_side_info"),
        "pair": ("TransformationPair", "build_transformations"),
        "triples": ("Triples", "compute_triples"),
    },
)
