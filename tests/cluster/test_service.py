"""The search service as a Ray Serve application (issue 42, item 5): the same app behind Ray
Serve's HTTP proxy answers as under uvicorn and follows a promote before the next search."""

from __future__ import annotations

import socket

import httpx
import pytest

from raycompat.store import GalleryStore
from raycompat.store.aliases import promote
from tests.store import test_aliases
from tests.store.test_aliases import served_copy

served_template = test_aliases.served_template  # the session's template store, a fixture

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_app_under_ray_serve_answers_and_follows_a_promote(
    ray_local, served_template, tmp_path
):
    from ray import serve

    from raycompat.cluster.service import search_application

    store = GalleryStore(served_copy(served_template, tmp_path))
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(search_application(store.uri(), num_cpus=0.5), route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        body = {"gallery": "g", "model": "m2", "ids": ["v1-3"], "k": 2}
        first = httpx.post(f"{url}/v1/search", json=body, timeout=60).json()
        assert (first["version"], first["hits"][0][0]["id"]) == ("v1", "v1-3")
        promote(store, "g", "m2", "v3")
        body["ids"] = ["v3-5"]
        after = httpx.post(f"{url}/v1/search", json=body, timeout=60).json()
        assert (after["version"], after["hits"][0][0]["id"]) == ("v3", "v3-5")
        assert 'raycompat_swaps_total{gallery="g",model="m2"}' in httpx.get(f"{url}/metrics").text
    finally:
        serve.shutdown()
