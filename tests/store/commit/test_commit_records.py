"""Commit in O(parts): ``check="records"`` reads part records, never rows (issue 15, item 1)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.cluster.pipelines.parts import PartWriter
from raycompat.store import (
    GalleryStore,
    StoreError,
    VerificationError,
    VersionInfo,
    embedding_schema,
    embedding_table,
)
from raycompat.store.commit import checks
from raycompat.store.commit.part_record import IdFingerprint

INFO = VersionInfo("v2", "m2", 4, False, "v2 = h(v1)")


def write_mapped(staging, name: str, input_ids: list[int], output_ids: list[int]) -> None:
    """A part as the transform writes it: reads ``input_ids``, writes rows ``output_ids``."""
    writer = PartWriter(staging, name, embedding_schema(4, "int64"))
    writer.read(pa.array(input_ids, pa.int64()))
    rows = np.random.default_rng(len(output_ids)).random((len(output_ids), 4))
    writer.write(embedding_table(np.array(output_ids, np.int64), rows))
    writer.close()


def source_fingerprint(n: int) -> IdFingerprint:
    return IdFingerprint.of(pa.array(range(n), pa.int64()))


@pytest.fixture
def staging(tmp_path):
    return GalleryStore(str(tmp_path)).begin("g", INFO, "job")


def test_records_commit_publishes_without_reading_a_row(staging, monkeypatch):
    write_mapped(staging, "part-0.parquet", list(range(0, 5)), list(range(0, 5)))
    write_mapped(staging, "part-1.parquet", list(range(5, 9)), list(range(5, 9)))

    def no_reads(*args, **kwargs):
        raise AssertionError("records check opened a Parquet file")

    monkeypatch.setattr(checks, "open_parquet", no_reads)
    info = staging.commit(expected_rows=9, expected_ids=source_fingerprint(9), check="records")
    assert (info.rows, len(info.files)) == (9, 2)
    assert IdFingerprint.from_dict(info.ids) == source_fingerprint(9)


def test_records_and_rows_checks_agree_on_the_fingerprint(tmp_path):
    infos = []
    for check in ("rows", "records"):
        staging = GalleryStore(str(tmp_path / check)).begin("g", INFO, "job")
        write_mapped(staging, "part-0.parquet", [3, 1, 2], [3, 1, 2])
        infos.append(staging.commit(check=check))
    assert infos[0].ids == infos[1].ids and infos[0].rows == infos[1].rows == 3


def test_a_part_that_lost_or_changed_rows_is_refused(staging):
    write_mapped(staging, "part-0.parquet", [0, 1, 2], [0, 1])  # a row lost
    with pytest.raises(VerificationError, match=r"part-0\.parquet: holds 2 rows .* input chunk"):
        staging.commit(check="records")
    write_mapped(staging, "part-0.parquet", [0, 1, 2], [0, 1, 7])  # an id changed
    with pytest.raises(VerificationError, match="rows were lost, duplicated or changed"):
        staging.commit(check="records")


def test_a_missing_or_doubled_chunk_is_caught_by_the_source_fingerprint(staging):
    write_mapped(staging, "part-0.parquet", [0, 1], [0, 1])
    write_mapped(staging, "part-1.parquet", [0, 1], [0, 1])  # the same chunk twice: 4 rows
    with pytest.raises(VerificationError, match=r"staged ids \(4 ids.*differ from the expected"):
        staging.commit(expected_ids=source_fingerprint(4), check="records")


def test_records_check_needs_parts_with_an_input_fingerprint(staging):
    staging.write_table(embedding_table(np.array([0, 1], np.int64), np.ones((2, 4))), "p.parquet")
    with pytest.raises(VerificationError, match=r"p\.parquet: .*no input fingerprint.*'rows'"):
        staging.commit(check="records")
    assert staging.commit(check="rows").rows == 2


def test_records_check_refuses_a_resized_part_and_ignores_a_foreign_file(staging):
    write_mapped(staging, "part-0.parquet", [0, 1], [0, 1])
    with open(staging.files()[0], "ab") as handle:
        handle.write(b"tail")
    with pytest.raises(VerificationError, match=r"part-0\.parquet: \d+ bytes but its part record"):
        staging.commit(check="records")
    write_mapped(staging, "part-0.parquet", [0, 1], [0, 1])  # a rerun writes a new file of it
    with open(f"{staging.path}/part-9.parquet", "wb") as handle:
        handle.write(b"PAR1")  # nobody's part: not on the writer's list, never read
    published = staging.commit(check="records", expected_ids=source_fingerprint(2))
    assert [f.rsplit("/", 1)[1] for f in published.files] == [
        staging.files()[0].rsplit("/", 1)[1]
    ]


def test_records_check_takes_only_a_fingerprint(staging):
    write_mapped(staging, "part-0.parquet", [0], [0])
    with pytest.raises(VerificationError, match="compares ids by fingerprint only"):
        staging.commit(expected_ids=[0], check="records")
    with pytest.raises(StoreError, match="'rows' or 'records'"):
        staging.commit(check="everything")
