"""The version record says who published it and, as Delta's DESCRIBE HISTORY does, the
operation that made it and its parameters (issue 40): small, and never a credential."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from raycompat.errors import CorruptFileError, UnsafePathError
from raycompat.io.credentials import REDACTED, register_secrets
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.commit.publish import MAX_PARAMETER_CHARS, MAX_PARAMETER_ITEMS, with_operation
from raycompat.store.formats.adopt import AdoptionPlan, publish_version

SUBMITTED = LeaseOwner(job="walk-up-1", host="node-3", pid=77, user="ana")


def info(version: str = "v1") -> VersionInfo:
    return VersionInfo(version, "m1", 4, False, f"{version} = h(v0)")


def test_a_commit_records_the_lease_holder_and_the_operation(tmp_path):
    store = GalleryStore(str(tmp_path))
    target = with_operation(info(), "transform", source="g/v0@2026-01-01", rows_per_file=2)
    staging = store.begin("g", target, "job", owner=SUBMITTED)
    rows = np.random.default_rng(0).random((2, 4))
    staging.write_table(embedding_table(["a", "b"], rows), "part-0.parquet")
    staging.commit(expected_rows=2)
    recorded = store.version("g", "v1")
    assert recorded.by == asdict(SUBMITTED)
    assert recorded.operation == "transform"
    assert recorded.parameters == {"source": "g/v0@2026-01-01", "rows_per_file": 2}


def test_an_adoption_records_its_operation_and_source(tmp_path):
    root = tmp_path / "table"
    pins = [{"path": "part-0.parquet", "bytes": 100, "rows": 5, "mtime_ns": 1}]
    adopted = VersionInfo(
        "v3", "m1", 4, False, "v3 = adopt(t)", rows=5, files=["part-0.parquet"],
        created="2099-01-01T00:00:00+00:00", external={"root": str(root), "pins": pins},
    )  # fmt: skip
    plan = AdoptionPlan("faces", "v3", "m1", str(root), str(root), ["part-0.parquet"])
    store = GalleryStore(str(tmp_path / "store"))
    publish_version(store, plan, adopted)
    recorded = store.version("faces", "v3")
    assert (recorded.operation, recorded.parameters) == ("adopt", {"source": str(root), "files": 1})
    assert recorded.by == asdict(LeaseOwner())  # no lease: this process


def test_parameters_are_small_and_hold_no_credential():
    secret = "publish-test-secret-5f2c9a"
    register_secrets({"key": secret})
    params = with_operation(
        info(),
        "extract",
        options={"secret": "plain-text-value", "root": f"s3://{secret}@bucket/x"},
        paths=[f"p{i}" for i in range(100)],
        source="x" * 1000,
        spec=Path("/data"),
        budget=0.25,
    ).parameters
    assert params["options"] == {"secret": REDACTED, "root": f"s3://{REDACTED}@bucket/x"}
    assert len(params["paths"]) == MAX_PARAMETER_ITEMS
    assert len(params["source"]) == MAX_PARAMETER_CHARS and params["source"].endswith("...")
    assert params["spec"] == "PosixPath('/data')" and params["budget"] == 0.25
    assert secret not in json.dumps(params)
    with pytest.raises(UnsafePathError):
        with_operation(info(), "../transform")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("by", "ana", "key 'by' must be an object or null"),
        ("operation", 3, "key 'operation' must be a string or null"),
        ("parameters", [], "key 'parameters' must be an object or null"),
    ],
)
def test_a_bad_audit_field_names_the_file_and_the_key(key, value, message):
    raw = json.loads(info().to_json()) | {"files": ["a.parquet"], key: value}
    with pytest.raises(CorruptFileError, match=message):
        VersionInfo.from_json(json.dumps(raw).encode(), "g/_versions/v1.json")


def test_a_record_without_audit_fields_reads_as_before():
    raw = json.loads(info().to_json()) | {"files": ["a.parquet"]}
    assert not {"by", "operation", "parameters"} & set(raw)  # absent, not null, when unset
    read = VersionInfo.from_json(json.dumps(raw).encode(), "g/_versions/v1.json")
    assert (read.by, read.operation, read.parameters) == (None, None, None)
