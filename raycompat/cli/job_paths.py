"""Where a job's paths point: one rule for every input and output of every job (docs/cluster.md,
"Paths of a submitted job").

An ``s3://`` URI or an absolute path is used as given. A relative path is the submitter's:

- an **output** (``store.root``, ``run.storage_path``, a sweep's ``storage_path``,
  ``report_dir``, ``work_dir``) resolves against the output root, ``--output-root DIR`` (env
  ``RAYCOMPAT_OUTPUT_ROOT``); without one it stays relative to the current directory. A job
  started by ``ray job submit --working-dir`` runs in Ray's temporary copy of that dir, which Ray
  deletes, so there a relative output without an output root is refused, naming the key;
- an **input** (``--config``, a sweep's ``base``, a model, transformation or weights file, image
  files) resolves against the output root first (where earlier jobs wrote: the upgrade store's
  ``_models/m1`` that the extraction job reads), then against the current directory (run
  directly: yours; submitted: the copy of your working dir, which holds what git does not
  ignore). Where it is found in neither, with an output root or under ``ray job submit``, it is
  one line naming the key and every place tried; run directly without one, the job's own check
  names it.

This module imports neither torch nor Ray.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raycompat.cli.job_exit import JOB_CONFIG_ENV  # Ray's job supervisor sets it
from raycompat.errors import ConfigError

OUTPUT_ROOT_ENV = "RAYCOMPAT_OUTPUT_ROOT"


def submitted_working_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Ray's temporary copy of the working dir this process runs in (a job submitted with a
    ``working_dir``), or None."""
    raw = (os.environ if environ is None else environ).get(JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    return os.getcwd() if runtime_env.get("working_dir") else None


def is_local_relative(value: Any) -> bool:
    return (
        isinstance(value, str) and bool(value) and "://" not in value and not os.path.isabs(value)
    )


@dataclass(frozen=True)
class JobPaths:
    """The two places a relative path can mean: ``output_root`` (``--output-root``, or None)
    and ``copy`` (Ray's working-dir copy the job runs in, or None when run directly)."""

    output_root: str | None = None
    copy: str | None = None

    def output(self, key: str, value: str) -> str:
        if not is_local_relative(value):
            return value
        if self.output_root:
            return os.path.abspath(os.path.join(self.output_root, value))
        if self.copy is not None:
            raise ConfigError(
                f"{key}={value!r} is relative, and this job runs in Ray's temporary copy of "
                f"its working dir ({self.copy}), which Ray deletes: pass an absolute path or s3:// "
                f"URI ({key}=/shared/...), or --output-root DIR (env {OUTPUT_ROOT_ENV})"
            )
        return value

    def input(self, key: str, value: str) -> str:
        if not is_local_relative(value):
            return value
        places = [("--output-root", self.output_root)] if self.output_root else []
        places.append(("the job's working dir" if self.copy else "the current dir", os.getcwd()))
        tried = [(name, os.path.abspath(os.path.join(base, value))) for name, base in places]
        for _, path in tried:
            if os.path.exists(path):
                return path if self.output_root else value
        if not self.output_root and self.copy is None:
            return value  # run directly: the job's own check names the missing input
        tried_text = ", ".join(f"{path} ({name})" for name, path in tried)
        hint = (
            ""
            if self.output_root
            else (
                f"; files git ignores (outputs/...) are not uploaded: pass --output-root DIR "
                f"(env {OUTPUT_ROOT_ENV}) where they are"
            )
        )
        raise ConfigError(
            f"{key}={value!r} is relative and was not found: tried {tried_text}{hint}"
        )


def job_paths(output_root: str | None, environ: Mapping[str, str] | None = None) -> JobPaths:
    """The job's :class:`JobPaths`; an ``output_root`` that is a file (or lies under one) is
    one line naming ``--output-root``, before anything runs (it would fail mid-run, at the
    first output written under it)."""
    if output_root:
        check_output_location("--output-root", output_root)
    return JobPaths(output_root or None, submitted_working_dir(environ))


def resolve_paths(cfg: Any, paths: JobPaths, outputs=(), inputs=()) -> Any:
    """``cfg`` with the paths at the dotted keys ``outputs`` and ``inputs`` (list entries by
    index: ``images.paths.0``) resolved by :class:`JobPaths` (an unset one is skipped)."""
    for key in outputs:
        _set(cfg, key, paths.output(key, get_key(cfg, key)))
    for key in inputs:
        _set(cfg, key, paths.input(key, get_key(cfg, key)))
    return cfg


def train_inputs(cfg: Any, prefix: str = "") -> list[str]:
    """The input keys of a ``TrainConfig`` (the weights files ``check_weight_files`` opens)."""
    keys = ["model.weights"]
    keys += [
        f"scenario.replacements.{i}.model.weights" for i in range(len(cfg.scenario.replacements))
    ]
    if cfg.scenario.old_model is not None:
        keys.append("scenario.old_model.checkpoint")
    return [prefix + key for key in keys]


def image_inputs(images: Any, prefix: str) -> list[str]:
    """The input keys of a ``SourceSpec``: its Parquet image files, if any."""
    return [f"{prefix}paths.{i}" for i in range(len(images.paths))]


def check_output_location(key: str, value: str) -> str:
    """What a job would write at the local output ``value``: ``exists`` or ``new under DIR``;
    one line naming ``key`` when the nearest existing folder is a file or is not writable.
    A remote URI is ``remote, not checked`` (a dry run touches nothing, S3 included)."""
    if "://" in value:
        return "remote, not checked"
    path = os.path.abspath(value)
    if os.path.isdir(path):
        found = "exists"
    else:
        while not os.path.exists(path):
            path = os.path.dirname(path)
        found = f"new under {path}"
    if not os.path.isdir(path):
        raise ConfigError(f"{key}={value!r} cannot be written: {path} is a file, not a folder")
    if not os.access(path, os.W_OK):
        raise ConfigError(f"{key}={value!r} cannot be written: {path} is not writable")
    return found


def get_key(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def _set(cfg: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = get_key(cfg, ".".join(parents)) if parents else cfg
    if last.isdigit():
        node[int(last)] = value
    else:
        setattr(node, last, value)
