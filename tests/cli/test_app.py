"""The ``raycompat`` CLI on a real store: versions, models, and search with a registered model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raycompat.cli.app import main
from raycompat.config.train import ModelSpec
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.train.export import build_model, export_model


@pytest.fixture
def served(tmp_path):
    """A gallery of 40 images embedded by an exported LeNet++, registered and granted."""
    spec = ModelSpec(backbone="lenetpp", head="dsimplex", num_classes=5)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    export_model(tmp_path / "m1", model.state_dict(), spec)
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 28, 28), dtype=np.uint8)
    paths = []
    for i, image in enumerate(pixels):
        paths.append(tmp_path / f"img{i}.png")
        Image.fromarray(image, mode="L").save(paths[-1])
    with torch.no_grad():
        gallery = model.forward_features(torch.from_numpy(pixels).float().div(255).unsqueeze(1))
    store = GalleryStore(str(tmp_path / "store"))
    info = VersionInfo(
        "v1", model_version="m1", width=4, normalized=False, lineage="v1 = extract(m1)"
    )
    staging = store.begin("digits", info, staging_name="t")
    staging.write_table(
        embedding_table([f"img{i}" for i in range(40)], gallery.numpy()), "p.parquet"
    )
    staging.commit(expected_rows=40)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", str(tmp_path / "m1"), 4, method="independent"))
    catalog.grant(QueryGrant("digits", "v1", "m1", "extracted"))
    return store, paths


def run(capsys, *argv) -> tuple[int, dict | str]:
    """Run the CLI as a script would (``--json``); returns the exit code and the JSON or stderr."""
    code = main([*argv, "--json"] if argv[0] != "report" else list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else err


def test_search_finds_each_query_image_itself_first(served, capsys):
    store, paths = served
    code, out = run(
        capsys,
        "search",
        "digits",
        str(paths[3]),
        str(paths[17]),
        "--store",
        store.uri(),
        "--model",
        "m1",
        "-k",
        "3",
    )
    assert code == 0 and out["gallery_version"] == "v1" and out["relation"] == "extracted"
    assert [r["ids"][0] for r in out["results"]] == ["img3", "img17"]
    assert all(len(r["ids"]) == 3 for r in out["results"])


def test_versions_and_models_list_what_the_catalog_holds(served, capsys):
    store, _ = served
    code, out = run(capsys, "versions", "digits", "--store", store.uri())
    assert code == 0
    (version,) = out["versions"]
    assert version["queried_by"] == ["m1"] and version["lineage"] == "v1 = extract(m1)"
    code, out = run(capsys, "models", "--store", store.uri())
    assert [m["model_version"] for m in out["models"]] == ["m1"]


def test_errors_name_what_is_missing(served, capsys, tmp_path):
    store, paths = served
    code, err = run(
        capsys,
        "search",
        "digits",
        str(paths[0]),
        "--store",
        store.uri(),
        "--model",
        "m9",
    )
    assert code == 1 and "'m9' is not registered" in err  # exit 1, as it always was
    assert err.endswith("registered models are m1\n")  # m9 is not close to m1: no hint
    code, err = run(
        capsys,
        "search",
        "digits",
        str(tmp_path / "nope.png"),
        "--store",
        store.uri(),
        "--model",
        "m1",
    )
    assert code == 2 and "nope.png" in err
    code, err = run(capsys, "versions", "faces", "--store", store.uri())
    assert code == 1 and f"no gallery 'faces' in {store.uri()}: galleries are digits" in err


def test_search_copies_model_files_out_of_the_store_when_uri_is_remote(served, capsys, tmp_path):
    """A model registered by the upgrade job on an S3 store has an s3:// uri: search copies its
    files out of the store instead of reading the uri as a local folder."""
    store, paths = served
    catalog = Catalog(store)
    uri = catalog.put_model_files("m2", str(tmp_path / "m1"))
    assert uri.endswith("_models/m2")
    catalog.register_model(ModelRecord("m2", "s3://elsewhere/_models/m2", 4, parent="m1"))
    catalog.grant(QueryGrant("digits", "v1", "m2", "compatible"))
    code, out = run(
        capsys,
        "search",
        "digits",
        str(paths[5]),
        "--store",
        store.uri(),
        "--model",
        "m2",
        "-k",
        "1",
    )
    assert code == 0 and out["relation"] == "compatible"
    assert out["results"][0]["ids"] == ["img5"]


def test_search_never_searches_nor_rebuilds_a_corrupt_index(served, capsys):
    """A corrupt index is not searched; search (a reader) answers exactly instead and leaves
    the index to ``raycompat index build``."""
    store, paths = served
    argv = ["search", "digits", str(paths[3]), "--store", store.uri(), "--model", "m1"]
    assert main(["index", "build", "digits", "--version", "v1", "--store", store.uri()]) == 0
    capsys.readouterr()
    code, first = run(capsys, *argv, "-k", "2")
    assert code == 0
    build = json.loads(Path(store.path("digits", "_index", "v1.json")).read_text())["build"]
    corrupt = Path(store.path("digits", "_index", "v1", build, "index.faiss"))
    corrupt.write_bytes(corrupt.read_bytes()[:100])
    code = main([*argv, "-k", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["results"] == first["results"]
    assert f"its index is unusable ({corrupt}: expected" in err and "searched its 40 rows" in err
    new = json.loads(Path(store.path("digits", "_index", "v1.json")).read_text())["build"]
    assert new == build


def test_listings_are_aligned_tables_by_default(served, capsys):
    store, _ = served
    assert main(["versions", "digits", "--store", store.uri()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "gallery digits"
    header, rule, row = lines[1:4]
    assert header.split() == [
        "version",
        "model",
        "rows",
        "width",
        "dtype",
        "lineage",
        "query",
        "models",
        "created",
    ]
    assert set(rule.replace(" ", "")) == {"-"}
    assert row.split()[:5] == ["v1", "m1", "40", "4", "float32"] and " m1 " in row
    assert row.index("40") + 2 == header.index("rows") + 4  # numbers end under their header
    assert main(["models", "--store", store.uri()]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[:3] == ["model", "dim", "method"] and row.split()[:3] == [
        "m1",
        "4",
        "independent",
    ]


def test_search_takes_stored_ids_or_vectors_and_prints_labels(served, capsys, tmp_path):
    store, paths = served
    base = ["--store", store.uri(), "--model", "m1", "-k", "2"]
    code, out = run(capsys, "search", "digits", "--ids", "img5", "img9", *base)
    assert code == 0 and [r["ids"][0] for r in out["results"]] == ["img5", "img9"]
    assert [r["query"] for r in out["results"]] == ["img5", "img9"]
    stored = store.read("digits", "v1")
    x = np.stack(stored.column("embedding").to_numpy(zero_copy_only=False))
    order = stored.column("id").to_pylist()
    np.save(tmp_path / "q.npy", x[[order.index("img11")]])
    code, out = run(capsys, "search", "digits", "--vectors", str(tmp_path / "q.npy"), *base)
    assert code == 0 and out["results"][0]["ids"][0] == "img11"
    assert out["results"][0]["labels"] == [None, None]  # this gallery stores no labels
    assert (out["metric"], out["index"]) == ("negative squared L2", "exact")
    assert out["results"][0]["scores"][0] <= 0  # -||q - g||^2, the label's sign
    assert main(["search", "digits", "--ids", "img5", *base]) == 0  # the table a person reads
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("gallery digits version v1 (extracted for model m1)")
    assert printed[1] == "score: negative squared L2 (exact)"  # v1 is unnormalized: l2
    assert printed[2].split() == ["query", "rank", "id", "score", "label"]
    assert printed[4].split()[:3] == ["img5", "1", "img5"] and printed[4].split()[-1] == "-"


def test_search_query_errors_are_one_line(served, capsys, tmp_path):
    store, paths = served
    base = ["--store", store.uri(), "--model", "m1"]
    code, err = run(capsys, "search", "digits", "--ids", "img999", *base)
    assert code == 1 and "no row with id(s) ['img999']" in err
    np.save(tmp_path / "wide.npy", np.ones((2, 7), np.float32))
    code, err = run(capsys, "search", "digits", "--vectors", str(tmp_path / "wide.npy"), *base)
    assert code == 2 and "wide.npy: expected finite vectors of shape (Q, 4)" in err
    code, err = run(capsys, "search", "digits", str(paths[0]), "--ids", "img1", *base)
    assert code == 2 and "one of them" in err


@pytest.fixture(scope="module")
def two_galleries(tmp_path_factory):
    """Galleries ``digits`` (v1 by m1, v2 by m2; m1 queries v1, m2 v2) and ``faces`` (v1 by
    m1), written without torch; a report folder ``runs/mnist-history``."""
    root = tmp_path_factory.mktemp("galleries")
    store, x = GalleryStore(str(root / "store")), np.eye(4, dtype=np.float32)
    catalog = Catalog(store)
    for model in ("m1", "m2"):
        catalog.register_model(ModelRecord(model, str(root / model), 4, method="independent"))
    for gallery, version, model in [
        ("digits", "v1", "m1"),
        ("digits", "v2", "m2"),
        ("faces", "v1", "m1"),
    ]:
        info = VersionInfo(version, model, 4, False, f"{version} = extract({model})")
        staging = store.begin(gallery, info, staging_name="t")
        staging.write_table(embedding_table([f"{gallery}{i}" for i in range(4)], x), "p.parquet")
        staging.commit(expected_rows=4)
        catalog.grant(QueryGrant(gallery, version, model, "extracted"))
    (root / "runs" / "mnist-history").mkdir(parents=True)
    (root / "runs" / "mnist-history" / "report.md").write_text("# report\n")
    return store, root


def test_galleries_lists_each_gallery_its_newest_version_and_query_models(two_galleries, capsys):
    store, _ = two_galleries
    code, out = run(capsys, "galleries", "--store", store.uri())
    assert code == 0
    assert out["galleries"] == [
        {
            "gallery": "digits",
            "versions": 2,
            "newest": "v2",
            "model_version": "m2",
            "rows": 4,
            "query_models": {"m1": "v1", "m2": "v2"},
        },
        {
            "gallery": "faces",
            "versions": 1,
            "newest": "v1",
            "model_version": "m1",
            "rows": 4,
            "query_models": {"m1": "v1"},
        },
    ]
    assert main(["galleries", "--store", store.uri()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"store {store.uri()}"
    assert lines[1].split()[:6] == ["gallery", "versions", "newest", "model", "rows", "query"]
    assert lines[3].split() == ["digits", "2", "v2", "m2", "4", "m1->v1,m2->v2"]


NEAREST_GALLERY = "no gallery '{name}' in {root}: galleries are digits, faces; did you mean"


@pytest.mark.parametrize(
    "argv, message",
    [
        ("versions digts", NEAREST_GALLERY.format(name="digts", root="{root}") + " 'digits'?"),
        (
            "search digts --ids digits1 --model m1",
            NEAREST_GALLERY.format(name="digts", root="{root}"),
        ),
        (
            "search digits --ids digits1 --model m_2",
            "model 'm_2' is not registered "
            "in {root}: registered models are m1, m2; did you mean 'm2'?",
        ),
        (
            "export faces /nonexistent/t --version v01 --format delta",
            "gallery 'faces' has no version 'v01': its versions are v1; did you mean 'v1'?",
        ),
        (
            "export face /nonexistent/t --version v1 --format delta",
            NEAREST_GALLERY.format(name="face", root="{root}") + " 'faces'?",
        ),
    ],
)
def test_unknown_names_list_those_that_exist_and_the_nearest(two_galleries, capsys, argv, message):
    """Issue 23: a gallery `mnst` read as a missing grant; now every command's lookup says
    which names exist, one line, with the exit status these lookups always had (1)."""
    store, _ = two_galleries
    code = main([*argv.split(), "--store", store.uri()])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert message.format(root=store.uri()) in err


def test_a_missing_report_folder_lists_the_runs_beside_it(two_galleries, capsys):
    _, root = two_galleries
    assert main(["report", str(root / "runs" / "mnist-histroy")]) == 1  # a missing file, as before
    err = capsys.readouterr().err
    assert "mnist-histroy/report.md does not exist" in err
    assert f"runs in {root / 'runs'} are mnist-history; did you mean 'mnist-history'?" in err


def add_version(store: GalleryStore, version: str, model: str, x: np.ndarray) -> None:
    """Publish ``digits/<version>`` of rows ``x`` (ids ``img<i>``) written by ``model``."""
    info = VersionInfo(version, model, x.shape[1], False, f"{version} = adopt(/tables/{model})")
    staging = store.begin("digits", info, staging_name="t")
    staging.write_table(embedding_table([f"img{i}" for i in range(len(x))], x), "p.parquet")
    staging.commit(expected_rows=len(x))


def test_search_takes_a_version_directly_with_or_without_a_model(served, capsys, tmp_path):
    """Issue 40, item 8: ``--version V`` searches V as asked. Without ``--model``, ``--ids``
    and ``--vectors`` (checked against V's width) still work; images need the model; a model
    that does not serve V gets a note."""
    store, paths = served
    add_version(store, "v2", "m2", np.eye(40, 4, dtype=np.float32))  # no model queries it
    base = ["--store", store.uri(), "-k", "1"]
    code, out = run(capsys, "search", "digits", "--ids", "img2", "--version", "v2", *base)
    assert code == 0 and (out["gallery_version"], out["relation"], out["model"]) == (
        "v2",
        None,
        None,
    )
    assert out["results"][0]["ids"] == ["img2"]
    np.save(tmp_path / "q.npy", np.eye(4, dtype=np.float32)[[3]])
    code, out = run(
        capsys, "search", "digits", "--vectors", str(tmp_path / "q.npy"), "--version", "v2", *base
    )
    assert code == 0 and out["results"][0]["ids"] == ["img3"]
    code, out = run(
        capsys, "search", "digits", "--ids", "img5", "--version", "v1", "--model", "m1", *base
    )
    assert code == 0 and (out["gallery_version"], out["relation"]) == ("v1", "extracted")
    argv = ["search", "digits", "--ids", "img1", "--version", "v2", "--model", "m1", *base]
    assert main(argv) == 0
    printed, err = capsys.readouterr()
    assert "model m1 serves v1; searching digits v2 as asked" in err
    assert printed.splitlines()[0] == "gallery digits version v2 (as asked, queries of model m1)"
    for argv, message in [
        ([str(paths[0]), "--version", "v1"], "query images need --model"),
        (["--ids", "img1"], "search needs --model (searches the version it serves) or --version"),
    ]:
        code, err = run(capsys, "search", "digits", *argv, *base)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, err = run(capsys, "search", "digits", "--ids", "img1", "--version", "v3", *base)
    assert code == 1 and "has no version 'v3': its versions are v1, v2" in err


def test_a_model_without_weights_is_listed_so_and_searches_with_vectors_only(served, capsys):
    """Issue 40, item 1: a model registered without weights (``raycompat adopt``) is marked in
    ``models``, ``versions`` and ``history``; a query image is one line saying it has no
    weights, while ``--ids`` still searches."""
    store, paths = served
    add_version(store, "v2", "ext", np.eye(40, 4, dtype=np.float32))
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("ext", "", 4, method="external"))
    catalog.grant(QueryGrant("digits", "v2", "ext", "extracted"))
    where = ["--store", store.uri()]

    code, out = run(capsys, "models", *where)
    assert [(m["model_version"], m["weights"]) for m in out["models"]] == [
        ("m1", True),
        ("ext", False),
    ]
    assert main(["models", *where]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.split()[:3] == ["ext", "4", "external"] and last.endswith("(no weights)")
    code, out = run(capsys, "versions", "digits", *where)
    assert out["without_weights"] == ["ext"]
    assert main(["versions", "digits", *where]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("v2       ext (no weights)") and row.count("ext (no weights)") == 2
    code, out = run(capsys, "history", "digits", *where)
    assert code == 0 and out["without_weights"] == ["ext"]
    assert main(["history", "digits", *where]) == 0
    text = capsys.readouterr().out
    assert text.count("ext (no weights)") == 3  # versions, grants, serving

    code, err = run(capsys, "search", "digits", str(paths[0]), "--model", "ext", *where)
    assert code == 1 and err.count("\n") == 1, err
    assert "model 'ext' has no weights in" in err and "cannot embed query images" in err
    code, out = run(
        capsys, "search", "digits", "--ids", "img2", "--model", "ext", "-k", "1", *where
    )
    assert code == 0 and out["results"][0]["ids"] == ["img2"]


def test_a_query_image_of_another_size_is_resized_with_a_note(served, capsys, tmp_path):
    """Issue 40, item 8: the LeNet++ takes 28 x 28; a 30 x 36 image is resized, and stderr says
    so in one line naming it."""
    store, paths = served
    pixels = np.random.default_rng(1).integers(0, 256, size=(30, 36), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "wide.png")
    argv = ["search", "digits", str(tmp_path / "wide.png"), str(paths[1]), "--model", "m1"]
    code, out = run(capsys, *argv, "--store", store.uri(), "-k", "1")
    assert code == 0 and len(out["results"]) == 2
    code = main([*argv, "--store", store.uri(), "--json"])
    err = capsys.readouterr().err.splitlines()
    note = [line for line in err if "resized" in line]
    assert note == [
        f"raycompat: note: resized 1 of 2 query image(s) to 28 x 28 (H x W), the model's input "
        f"size: {tmp_path / 'wide.png'} (30 x 36)"
    ]
