"""Deploy the search service on a Ray cluster as a Ray Serve application, and return.

    raycompat-deploy --config configs/deploy_demo.yaml    # the console script: the same job
    python jobs/deploy.py --config configs/deploy_demo.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/deploy.py --config configs/deploy_demo.yaml \\
        --output-root "$PWD"   # docs/cluster.md, "Paths of a submitted job"

The job checks the config and that the store can be read, starts Serve's HTTP proxy where
``http`` says (unless Serve already runs on the cluster: then its proxy stays where it is),
deploys ``deployment`` (replicas or autoscaling, resources) and waits until every replica has
loaded the store's indexes; it logs the URL and exits 0. The application outlives the job: it
serves and follows the store until ``serve shutdown -y`` (every Serve application) or
``serve.delete(<deployment.name>)`` from Python (this one alone: the ``serve`` command has no
per-application delete).
Submitting it again deploys the application again under the same name: Ray Serve replaces its
replicas with a rolling update. docs/serving.md, "On a cluster".
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
from raycompat.config.serve import ServeJobConfig
from raycompat.console import configure_console
from raycompat.errors import ConfigError
from raycompat.io.credentials import register_secrets
from raycompat.service.config import ServiceConfig

logger = logging.getLogger("raycompat.jobs.deploy")
STOP_COMMAND = "serve shutdown -y"  # what the summary tells an operator to stop it with


def inputs(cfg: ServeJobConfig) -> list[str]:
    """The paths the job reads (never writes): the store, and the token's file."""
    return ["store.root"] + (["service.token_file"] if cfg.service.token_file else [])


DEFAULT = "the built-in ServeJobConfig defaults, which name no store"
# Shown under "examples:" in --help; tests/cli/test_help_examples.py loads every one.
EXAMPLES = (
    "raycompat-deploy --config configs/deploy_demo.yaml",
    "raycompat-deploy --config configs/deploy_demo.yaml deployment.autoscaling.max_replicas=4 "
    "http.port=8080",
)


def main(argv: list[str] | None = None) -> dict:
    parser = job_parser(__doc__, "ServeJobConfig", default=DEFAULT, examples=EXAMPLES)
    args = parser.parse_args(argv)
    configure_console(args.verbose)  # every log line scrubbed of credentials
    cfg = job_config(ServeJobConfig, args, default=DEFAULT, inputs=inputs)
    register_secrets(cfg)
    root = cfg.store.checked_root()
    service = ServiceConfig.from_spec(cfg.service)  # a bad token or shadow: one line, before Ray

    from raycompat.cli.store_options import JOB_HINT, reach_store
    from raycompat.cluster.console import init_ray, set_log_level
    from raycompat.store import GalleryStore

    set_log_level(args.verbose)
    store = GalleryStore(root, cfg.store.storage_options)
    if not reach_store(store, JOB_HINT):  # unreachable or missing: one line, before Ray
        raise ConfigError(f"store.root {store.uri()}: no store there, nothing to serve")
    announce_outputs(cfg, (), inputs=inputs(cfg), dry_run=args.dry_run)
    init_ray(args.address or cfg.ray_address, args.verbose)

    from ray import serve

    from raycompat.cluster.service import search_application

    serve.start(http_options={"host": cfg.http.host, "port": cfg.http.port})
    name, prefix = cfg.deployment.name, cfg.deployment.route_prefix
    serve.run(search_application(cfg, service), name=name, route_prefix=prefix)
    status = serve.status()
    proxy = f"http://{cfg.http.host}:{cfg.http.port}{prefix.rstrip('/')}"
    logger.info("serving %s as Ray Serve application %s at %s", store.uri(), name, proxy)
    deployment = status.applications[name].deployments["SearchService"]
    return log_summary(
        logger,
        {
            "application": name,
            "status": str(status.applications[name].status.value),
            "replicas": sum(deployment.replica_states.values()),
            "url": proxy,
            "stop": f"{STOP_COMMAND} (every application), or serve.delete({name!r}) in Python",
        },
    )


run = console_script(main, "raycompat-deploy")


if __name__ == "__main__":
    run()
