"""FCT training (Ramanujan et al., CVPR 2022): the transformation ``h``, its side-information
model ``psi`` and the optional ``g``, trained and exported for the forward-transform pipelines.

The package imports nothing at load time, so its Ray-free modules stay cheap to import:

- :mod:`raycompat.config.fct`: typed configs (``FCTSpec``, ``TransformationTrainConfig``, ...),
  read by the upgrade and Tune configs before Ray starts;
- :mod:`raycompat.fct.checks`: the checks run before a run starts (sources, widths, triples);
- :mod:`raycompat.fct.triples`: ``(phi_old, psi, phi_new)`` of a training set, in process;
- :mod:`raycompat.fct.export`: save and load ``h``/``g``/``psi`` as safetensors + JSON;
- :mod:`raycompat.fct.pair`: ``h`` and ``g`` as the one module a transformation run trains;
- :mod:`raycompat.cluster.train.fct_fit`: fit ``h`` from arrays (Ray Train when called) and apply
  it;
- :mod:`raycompat.cluster.train.fct_loop`: the Ray Train V2 runs (Ray layer), on the per-worker
  skeleton shared with model training (:mod:`raycompat.cluster.train.worker`).

The model and loss themselves are core: :mod:`raycompat.fct.transformation`.
"""
