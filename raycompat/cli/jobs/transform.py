"""Write a new gallery version with Ray Data: FCT transformation, extraction or identity upgrade.

    raycompat-transform --config configs/transform_fct.yaml   # the console script: the same job
    python jobs/transform.py --config configs/transform_fct.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/transform.py --config configs/<x>.yaml \\
        --output-root "$PWD"   # docs/cluster.md, "Paths of a submitted job"

``mode: transform`` maps ``store.gallery/source_version`` through h (and g) into
``target.version``; ``mode: extract`` embeds ``images`` with ``model``; ``mode: identity``
checks the source version and writes nothing (backward-compatible upgrade). A written version
is granted to ``target.model_version``, registered if new (an extraction's model with its files,
a transform's without weights: it queries with vectors; ``serving/query_access.py``), so
``raycompat search G --model M`` searches it. Run it again with
the same config after a failure or a kill: finished part files are kept and skipped; after the
version was published it reports "already published" and exits 0. Inputs (h, the model, the
source version) are checked before Ray starts.
"""

from __future__ import annotations

import logging

from raycompat.cli.job_entry import (
    announce_outputs,
    console_script,
    job_config,
    job_parser,
    log_summary,
)
from raycompat.cli.job_paths import image_inputs
from raycompat.config.pipelines import TransformJobConfig
from raycompat.console import configure_console
from raycompat.errors import ConfigError
from raycompat.io.credentials import register_secrets

logger = logging.getLogger("raycompat.jobs.transform")
# Its paths (raycompat/cli/job_paths.py): the store is written (and read: the source version).
OUTPUTS = ("store.root",)


def inputs(cfg: TransformJobConfig) -> list[str]:
    keys = ["model", "transformation", "side_info_transformation"]
    return keys + image_inputs(cfg.images, "images.")


# What runs without --config (named in --help and logged at start).
DEFAULT = "the built-in TransformJobConfig defaults, which name no store"
# Shown under "examples:" in --help; tests/cli/test_help_examples.py loads every one.
EXAMPLES = (
    "raycompat-transform --config configs/transform_extract_mnist.yaml",
    "raycompat-transform --config configs/transform_extract_mnist.yaml target.version=v2 "
    "run.actors=1",
    "raycompat-transform --config configs/transform_fct.yaml store.root=s3://bucket/galleries",
)


def target_version(cfg: TransformJobConfig):
    """The ``VersionInfo`` to publish, from ``cfg.target``; the lineage defaults to
    ``"<v> = h(<source>)"`` (transform) or ``"<v> = extract(<model>)"`` (extract)."""
    from raycompat.store import VersionInfo

    t = cfg.target
    default_lineage = (
        f"{t.version} = h({cfg.source_version})"
        if cfg.mode == "transform"
        else f"{t.version} = extract({t.model_version})"
    )
    return VersionInfo(
        t.version,
        t.model_version,
        t.width,
        t.normalized,
        t.lineage or default_lineage,
        t.side_info_width,
        dtype=t.dtype,
    )


def write_version(cfg: TransformJobConfig, store, target) -> dict:
    """Run the transform or the extraction (Ray started) and return its summary."""
    from raycompat.cluster.pipelines import extract_version, transform_version

    gallery, staging_name = cfg.store.gallery, cfg.target.staging_name
    if cfg.mode == "transform":
        result = transform_version(
            store,
            gallery,
            cfg.source_version,
            target,
            cfg.transformation,
            cfg.side_info_transformation,
            cfg.run,
            staging_name,
        )
    else:
        result = extract_version(
            store,
            gallery,
            target,
            cfg.model,
            cfg.images,
            cfg.run,
            cfg.augment,
            cfg.seed,
            staging_name,
        )
    info = result.pop("version")
    return {**result, "version": info.version, "rows": info.rows, "files": len(info.files)}


def main(argv: list[str] | None = None) -> dict:
    parser = job_parser(
        __doc__, "TransformJobConfig", default=DEFAULT, address=False, examples=EXAMPLES
    )
    args = parser.parse_args(argv)
    configure_console(args.verbose)  # every log line scrubbed of credentials
    cfg = job_config(TransformJobConfig, args, default=DEFAULT, outputs=OUTPUTS, inputs=inputs)
    register_secrets(cfg)
    for key in ("root", "gallery"):
        if not getattr(cfg.store, key):
            raise ConfigError(f"store.{key} must be set")

    from raycompat.cli.store_options import JOB_HINT, reach_store
    from raycompat.cluster.console import init_ray, set_log_level
    from raycompat.cluster.pipelines import identity_upgrade
    from raycompat.cluster.pipelines.preflight import already_published, check_inputs
    from raycompat.store import GalleryStore

    set_log_level(args.verbose)  # our DEBUG lines with --verbose, before Ray starts (or not)
    store = GalleryStore(
        cfg.store.root, cfg.store.storage_options, lease_timeout_s=cfg.store.lease_timeout_s
    )
    reach_store(store, JOB_HINT)  # an unreachable store is one line, before Ray starts
    check_inputs(cfg, store)  # before Ray starts: h, the model, the source version
    announce_outputs(cfg, OUTPUTS, inputs=inputs(cfg), dry_run=args.dry_run)
    gallery = cfg.store.gallery
    if cfg.mode == "identity":
        upgrade = identity_upgrade(store, gallery, cfg.source_version, cfg.target.model_version)
        return log_summary(logger, {"mode": "identity", **upgrade.__dict__})
    target = target_version(cfg)
    done = already_published(store, gallery, target)
    if done is not None:  # a rerun after the publish (e.g. killed before it could report)
        logger.info("%s/%s is already published; nothing to do", gallery, target.version)
        grant_target(cfg, store, done)  # a no-op unless the run was killed before its grant
        published = {"version": done.version, "rows": done.rows, "files": len(done.files)}
        return log_summary(logger, {"mode": cfg.mode, "already_published": True, **published})
    init_ray(cfg.ray_address, args.verbose)  # quiet console unless --verbose
    summary = write_version(cfg, store, target)
    grant_target(cfg, store, store.version(gallery, target.version))
    return log_summary(logger, {"mode": cfg.mode, **summary})


def grant_target(cfg: TransformJobConfig, store, info) -> None:
    """The target model queries the published version (``serving/query_access.py``): an
    extraction's model with its files copied into the store, a transform's without weights."""
    from raycompat.serving.query_access import grant_written
    from raycompat.train.export import MODEL_FILE, SPEC_FILE

    relation = "transformed" if cfg.mode == "transform" else "extracted"
    model_dir = cfg.model if cfg.mode == "extract" else None
    line = grant_written(
        store, cfg.store.gallery, info, relation, model_dir, (MODEL_FILE, SPEC_FILE)
    )
    logger.info("%s", line)


run = console_script(
    main,
    "raycompat-transform",
    resumes="rerunning the same command resumes from the parts already written",
)


if __name__ == "__main__":
    run()
