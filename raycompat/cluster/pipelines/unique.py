"""Distributed id uniqueness: a hash-partitioned Ray Data ``groupby`` over staged parts.

Where nothing vouches for a version's ids (extraction from images), commit would otherwise
read every id on the driver (``check="rows"``: ~75 B/row, 70-90 GB at 10^9 rows). Here the ids
are read and grouped by Ray Data on the cluster; only the duplicated ids (if any) and the files
holding the first of them come back to the driver.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import ray

from raycompat.store import DuplicateIdError, Staging
from raycompat.store.commit.part_record import part_of_file

_COUNT = "count()"
SHOWN = 3  # duplicated ids named in the error


def _repeated(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.greater(batch[_COUNT], 1))


def check_unique_distributed(staging: Staging, paths: list[str], id_column: str = "id") -> None:
    """Raise :class:`DuplicateIdError` naming a duplicated id and the part files holding it.

    Args:
        staging: what holds the files; only its ``filesystem`` and ``uri_of`` are used (an
            adopted table passes ``pipelines.adopt.TableFiles``).
        paths: filesystem paths of the staged parts (``staging.files()``).
        id_column: the files' id column (an adopted table's may have another name).
    """
    ids = ray.data.read_parquet(
        paths, filesystem=staging.filesystem, columns=[id_column], include_paths=True
    )
    if id_column != "id":
        ids = ids.rename_columns({id_column: "id"})
    repeated = (
        ids.select_columns(["id"])
        .groupby("id")
        .count()
        .map_batches(_repeated, batch_format="pyarrow")
        .take(SHOWN)
    )
    if not repeated:
        return
    first = repeated[0]["id"]

    def holding(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.equal(batch["id"], pa.scalar(first, batch.schema.field("id").type)))

    where = ids.map_batches(holding, batch_format="pyarrow").take(20)
    files = sorted({staging.uri_of(r["path"]) for r in where}, key=part_of_file)  # part order
    others = [r["id"] for r in repeated[1:]]
    raise DuplicateIdError(
        f"duplicate id {first!r} ({repeated[0][_COUNT]} rows) in {', '.join(files)}"
        + (f"; other duplicated ids include {others}" if others else "")
    )
