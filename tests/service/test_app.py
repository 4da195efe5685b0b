"""The service over real HTTP (uvicorn on a free loopback port, httpx): answers equal the
library's ``search``, name their version, index and metric; bad input is refused with the
field and row named; the bearer token guards every endpoint but the probes; metrics count what
happened (issue 42, items 2 and 6). As a load balancer and an orchestrator see it (item 5):
every error is JSON, liveness and readiness are two probes, each request is logged in one
line."""

from __future__ import annotations

import json
import logging
import time

import httpx
import numpy as np
import pytest

from raycompat.service import Served, ServiceConfig, create_app, running
from raycompat.serving.query_path import search
from raycompat.serving.served_log import promote
from tests.service.conftest import corrupt

TOKEN = "s3cr3t-t0ken-for-tests"


@pytest.fixture
def url(store):
    with running(create_app(Served(store), ServiceConfig(max_k=50, max_body_bytes=4096))) as url:
        yield url


def post(url: str, body: dict, headers: dict | None = None) -> httpx.Response:
    """POST ``body`` as Python writes JSON: NaN as the ``NaN`` literal many clients send."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{url}/v1/search", content=json.dumps(body), headers=headers, timeout=10)


def test_an_answer_equals_the_librarys_search_and_names_version_index_and_metric(url, store):
    queries = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    got = post(url, {"gallery": "g", "model": "m2", "vectors": queries.tolist(), "k": 3})
    assert got.status_code == 200, got.text
    answer = got.json()
    want = search(store, "g", "m2", vectors=queries, k=3)
    assert {k: answer[k] for k in ("gallery", "model", "version", "index", "metric")} == {
        "gallery": "g", "model": "m2", "version": want.version, "index": want.index,
        "metric": want.metric,
    }  # fmt: skip
    assert (answer["version"], answer["metric"]) == ("v1", "negative squared L2")
    for hits, expected in zip(answer["hits"], want.hits, strict=True):
        assert [h["id"] for h in hits] == expected.ids.tolist()
        assert [h["score"] for h in hits] == pytest.approx(expected.scores.tolist(), rel=1e-5)
    by_id = post(url, {"gallery": "g", "model": "m1", "ids": ["v1-7"], "k": 1}).json()
    assert by_id["hits"] == [[{"id": "v1-7", "score": 0.0}]]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"gallery": "gg", "model": "m2", "ids": ["v1-1"]}, 404, "galleries are g; did you"),
        ({"gallery": "g", "model": "m9", "ids": ["v1-1"]}, 404, "its models are m1, m2, m3"),
        ({"gallery": "g", "model": "m2", "vectors": [[1, 2, 3]]}, 400,
         "vectors: expected finite rows of model m2's width 4, got shape (1, 3)"),
        ({"gallery": "g", "model": "m2", "vectors": [[1, 2, 3, 4], [1, 2, float("nan"), 4]]},
         400, "NaN or inf in row 1"),
        ({"gallery": "g", "model": "m2", "vectors": [[1, 2, 3, 4], [1, 2]]}, 400,
         "vectors[1]: expected a list of 4 numbers"),
        ({"gallery": "g", "model": "m2", "vectors": [[1, 2, 3, 4]], "k": 51}, 400,
         "k: expected an integer from 1 to 50"),
        ({"gallery": "g", "model": "m2", "ids": ["v1-1"], "top": 3}, 400,
         "unknown field(s) top"),
        ({"gallery": "g", "model": "m2", "ids": ["nope"]}, 400, "ids: g/v1 holds no row"),
        ({"gallery": "g", "model": "m2", "ids": ["x"] * 1000}, 413, "over the limit of 4096"),
        ({"gallery": "g", "ids": ["v1-1"]}, 400, "body: give model (or alias"),
        ({"gallery": "g", "alias": "", "ids": ["v1-1"]}, 400, "alias: expected a name"),
        ({"gallery": "g", "alias": "prd", "ids": ["v1-1"]}, 404, "has no alias 'prd'"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_field(url, body, status, message):
    got = post(url, body)
    assert got.status_code == status and message in got.json()["error"], got.text


def test_the_other_endpoints_list_what_is_served_and_count_requests(url):
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "pairs": 3, "aliases": 0}
    listing = httpx.get(f"{url}/v1/galleries").json()["galleries"]
    assert listing["g"]["m3"] == {
        "version": "v1",
        "index": "exact",
        "metric": "negative squared L2",
    }
    post(url, {"gallery": "g", "model": "m1", "ids": ["v1-1"]})
    post(url, {"gallery": "g", "model": "m0", "ids": ["v1-1"]})
    text = httpx.get(f"{url}/metrics").text
    assert 'raycompat_requests_total{endpoint="/v1/search",status="200"} 1.0' in text
    assert 'raycompat_requests_total{endpoint="/v1/search",status="404"} 1.0' in text
    assert 'raycompat_serving{gallery="g",model="m2",version="v1"} 1.0' in text
    assert 'raycompat_request_seconds_count{endpoint="/v1/search"} 2.0' in text


def test_a_named_alias_answers_naming_its_pair_and_refuses_another_models_vectors(store):
    from raycompat.serving import aliases

    aliases.set_alias(store, "g", "prod", "v3", "m2")
    with running(create_app(Served(store))) as url:
        assert httpx.get(f"{url}/healthz").json()["aliases"] == 1
        listed = httpx.get(f"{url}/v1/galleries").json()["aliases"]["g"]["prod"]
        assert (listed["version"], listed["model"]) == ("v3", "m2")
        body = {"gallery": "g", "alias": "prod", "ids": ["v3-5"], "k": 1}
        answer = post(url, body).json()
        assert (answer["alias"], answer["model"], answer["version"]) == ("prod", "m2", "v3")
        assert answer["hits"][0][0]["id"] == "v3-5"
        vectors = {"gallery": "g", "alias": "prod", "model": "m2", "vectors": [[1, 2, 3, 4]]}
        assert post(url, vectors).json()["version"] == "v3"
        aliases.set_alias(store, "g", "prod", "v1", "m1")  # the alias moves to m1
        moved = post(url, vectors)  # m2's vectors are not searched as m1's
        assert moved.status_code == 409, moved.text
        assert moved.json()["error"] == (
            "model: alias prod of gallery g points at version v1 searched by model m1 now, "
            "not model m2"
        )
        assert post(url, body | {"ids": ["v1-5"]}).json()["version"] == "v1"
        text = httpx.get(f"{url}/metrics").text
        assert 'raycompat_alias_swaps_total{alias="prod",gallery="g"} 2.0' in text
        assert 'raycompat_alias_serving{alias="prod",gallery="g",model="m1",version="v1"}' in text
        assert 'model="m2",version="v3"' not in text  # the old pair's gauge is gone


def test_the_watcher_swaps_without_any_request(store):
    config = ServiceConfig(poll_s=0.05, check_each_request=False)
    with running(create_app(Served(store), config)) as url:
        promote(store, "g", "m2", "v2")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            listing = httpx.get(f"{url}/v1/galleries").json()["galleries"]
            if listing["g"]["m2"]["version"] == "v2":
                break
            time.sleep(0.02)
        assert listing["g"]["m2"]["version"] == "v2"
        assert (
            'raycompat_swaps_total{gallery="g",model="m2"} 2.0' in httpx.get(f"{url}/metrics").text
        )


def test_the_bearer_token_guards_every_endpoint_and_is_never_logged(store, caplog):
    caplog.set_level(logging.DEBUG)
    with running(create_app(Served(store), ServiceConfig(token=TOKEN))) as url:
        for path in ("/metrics", "/v1/galleries", "/nope"):
            assert httpx.get(f"{url}{path}").status_code == 401
            wrong = httpx.get(f"{url}{path}", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
            right = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
            assert right.status_code == (404 if path == "/nope" else 200)
        body = {"gallery": "g", "model": "m1", "ids": ["v1-1"]}
        assert post(url, body).status_code == 401
        assert post(url, body, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert TOKEN not in caplog.text and "swap g/m1" in caplog.text
    assert TOKEN not in repr(ServiceConfig(token=TOKEN))


def test_a_shadowed_pair_reports_its_overlap_in_the_metrics(store):
    from raycompat.service.shadow import ShadowSpec

    config = ServiceConfig(shadow=(ShadowSpec("g", "m1", "v4"),))
    with running(create_app(Served(store), config)) as url:
        answer = post(url, {"gallery": "g", "model": "m1", "ids": ["v1-1"], "k": 2}).json()
        assert answer["version"] == "v1"
        want = 'raycompat_shadow_overlap_at_k_count{candidate="v4",gallery="g",model="m1"} 1.0'
        deadline = time.monotonic() + 5
        while want not in httpx.get(f"{url}/metrics").text and time.monotonic() < deadline:
            time.sleep(0.02)
        assert want in httpx.get(f"{url}/metrics").text


def test_the_probes_are_open_by_default_and_ask_the_token_with_probe_auth(store):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with running(create_app(Served(store), ServiceConfig(token=TOKEN))) as url:
        for path in ("/healthz", "/readyz"):  # a load balancer's check carries no token
            assert httpx.get(f"{url}{path}").status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 401
    with running(create_app(Served(store), ServiceConfig(token=TOKEN, probe_auth=True))) as url:
        for path in ("/healthz", "/readyz"):
            assert httpx.get(f"{url}{path}").status_code == 401
            assert httpx.get(f"{url}{path}", headers=auth).status_code == 200


def test_an_unknown_path_and_a_wrong_method_are_json_errors(url):
    missing = httpx.get(f"{url}/v1/serach")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    assert missing.json()["error"].startswith("no endpoint GET /v1/serach: the endpoints are ")
    assert "POST /v1/search" in missing.json()["error"]
    wrong = httpx.get(f"{url}/v1/search")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"error": "GET /v1/search: method not allowed; /v1/search takes POST"}
    assert httpx.post(f"{url}/healthz").json()["error"].endswith("/healthz takes GET, HEAD")


def test_a_bug_is_a_json_500_and_is_counted(store, monkeypatch):
    served = Served(store)
    with running(create_app(served)) as url:
        monkeypatch.setattr(served, "listing", lambda: 1 / 0)
        failed = httpx.get(f"{url}/v1/galleries")
        assert failed.status_code == 500 and failed.json() == {
            "error": "internal error (logged by the service)"
        }
        text = httpx.get(f"{url}/metrics").text
        assert 'raycompat_requests_total{endpoint="/v1/galleries",status="500"} 1.0' in text


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raycompat.service.access"]


def test_each_request_is_one_access_log_line_without_vectors_or_token(store, caplog):
    caplog.set_level(logging.INFO, logger="raycompat.service.access")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    vectors = [[0.123456, 0.654321, 0.5, 0.25]]
    with running(create_app(Served(store), ServiceConfig(token=TOKEN))) as url:
        post(url, {"gallery": "g", "model": "m2", "vectors": vectors, "k": 2}, headers=auth)
        post(url, {"gallery": "g", "model": "m9", "ids": ["v1-1"]}, headers=auth)
        httpx.get(f"{url}/healthz?token={TOKEN}")
    found, missing, probe = access_lines(caplog)
    assert found.startswith("127.0.0.1:") and " POST /v1/search 200 " in found
    assert found.endswith(" ms g/m2 v1")  # the route searched and the version that answered
    assert " POST /v1/search 404 " in missing and missing.endswith(" ms g/m9")
    assert " GET /healthz 200 " in probe  # the path only: no query string
    assert TOKEN not in caplog.text and "0.123456" not in caplog.text
    caplog.clear()
    with running(create_app(Served(store), ServiceConfig(access_log=False))) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
    assert access_lines(caplog) == []


def test_a_store_it_cannot_load_is_live_not_ready_and_its_searches_are_503(store, caplog):
    corrupt(store, "v1")  # every model of g serves v1
    caplog.set_level(logging.WARNING, logger="raycompat.service.served")
    with running(create_app(Served(store), ServiceConfig(poll_s=0.02))) as url:
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "pairs": 0, "aliases": 0}
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json()["ready"] is False and ready.json()["unloadable"] == 3
        assert "cannot be loaded here" in ready.json()["error"]
        searched = post(url, {"gallery": "g", "model": "m1", "ids": ["v1-1"]})
        assert searched.status_code == 503, searched.text
        error = searched.json()["error"]
        assert (
            error.startswith("g/m1 serves v1, which cannot be loaded here: ") and "parquet" in error
        )
        listed = httpx.get(f"{url}/v1/galleries").json()["galleries"]["g"]["m1"]
        assert listed["serves"] is None and listed["unloadable"] == error
        time.sleep(0.5)  # some 25 polls, each retrying the three routes
    warned = [r for r in caplog.records if "cannot be loaded here" in r.getMessage()]
    assert sorted(r.getMessage().split(" ")[0] for r in warned) == ["g/m1", "g/m2", "g/m3"]
