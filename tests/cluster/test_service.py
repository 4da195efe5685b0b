"""The search service as a Ray Serve application (issue 42, item 5), run as a user runs it
against a real ``ray start --head`` (the submitted-history test's ``ray_head``): deployed by
``ray job submit -- python jobs/deploy.py``, and by ``serve run raycompat.cluster.service:app``;
each answers over Serve's HTTP proxy as under uvicorn, with the replicas and autoscaling its
config names, and follows a promote before the next search."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import httpx
import pytest
import yaml

from raycompat.serving.served_log import promote
from raycompat.store import GalleryStore
from tests.cluster.upgrade import test_job
from tests.cluster.upgrade.test_job import ANSI, ROOT, VENV_BIN, _free_ports
from tests.serving import test_served_log
from tests.serving.test_served_log import served_copy

served_template = test_served_log.served_template  # the session's template store, a fixture
ray_head = test_job.ray_head  # a real `ray start --head` of this module, a fixture

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def deployed(ray_head, served_template, tmp_path_factory):
    """The demo-like store served by ``ray job submit -- python jobs/deploy.py`` (autoscaling
    between 1 and 2 replicas of half a CPU) on a free port; ``(store, url, job output, env,
    ports)``. Serve is shut down at the end."""
    address, env, ports = ray_head
    tmp = tmp_path_factory.mktemp("deploy")
    store = GalleryStore(served_copy(served_template, tmp))
    (port,) = _free_ports(1)
    config = tmp / "deploy.yaml"
    shipped = yaml.safe_load((ROOT / "configs" / "deploy_demo.yaml").read_text())
    shipped["store"]["root"] = store.uri()
    shipped["http"]["port"] = port
    shipped["deployment"]["num_cpus"] = 0.5
    config.write_text(yaml.safe_dump(shipped))
    done = subprocess.run(
        [f"{VENV_BIN}/ray", "job", "submit", f"--address={address}", "--working-dir", str(ROOT),
         "--", "python", "jobs/deploy.py", "--config", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )  # fmt: skip
    output = ANSI.sub("", done.stdout)
    assert done.returncode == 0 and "raycompat: exit 0 (ok)" in output, output[-4000:]
    try:
        yield store, f"http://127.0.0.1:{port}", output, env, ports
    finally:
        subprocess.run(
            [f"{VENV_BIN}/serve", "shutdown", "-y", f"--address={address}"],
            env=env, capture_output=True, timeout=120,
        )  # fmt: skip


def search(url: str, body: dict) -> dict:
    got = httpx.post(f"{url}/v1/search", json=body, timeout=60)
    assert got.status_code == 200, got.text
    return got.json()


def test_a_submitted_deploy_serves_with_its_configs_autoscaling_and_follows_a_promote(
    deployed, ray_head
):
    store, url, output, _, _ = deployed
    assert f"serving {store.uri()} as Ray Serve application raycompat-search at {url}" in output
    body = {"gallery": "g", "model": "m2", "ids": ["v1-3"], "k": 2}
    first = search(url, body)
    assert (first["version"], first["hits"][0][0]["id"]) == ("v1", "v1-3")
    promote(store, "g", "m2", "v3")
    after = search(url, body | {"ids": ["v3-5"]})
    assert (after["version"], after["hits"][0][0]["id"]) == ("v3", "v3-5")
    assert 'raycompat_swaps_total{gallery="g",model="m2"}' in httpx.get(f"{url}/metrics").text
    dashboard, _, _ = ray_head
    with urllib.request.urlopen(f"{dashboard}/api/serve/applications/", timeout=30) as answer:
        apps = json.load(answer)["applications"]
    deployment = apps["raycompat-search"]["deployments"]["SearchService"]["deployment_config"]
    scaling = deployment["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (1, 2)
    assert deployment["ray_actor_options"]["num_cpus"] == 0.5


def test_serve_run_deploys_the_same_app_from_its_config_and_overrides(deployed):
    """``serve run ... :app config=FILE key=value`` beside the submitted one, on the running
    Serve's proxy (its port is Serve's, set by the first deploy)."""
    store, url, _, env, ports = deployed
    config = ROOT / "configs" / "deploy_demo.yaml"
    done = subprocess.run(
        [f"{VENV_BIN}/serve", "run", f"--address=127.0.0.1:{ports['6390']}", "--non-blocking",
         "--name", "second", "--route-prefix", "/second", "raycompat.cluster.service:app",
         f"config={config}", f"store.root={store.uri()}", "deployment.num_cpus=0.5",
         "service.max_k=3"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, ANSI.sub("", done.stdout)[-4000:]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # --non-blocking returns once the app is deployed
        got = httpx.post(
            f"{url}/second/v1/search",
            json={"gallery": "g", "model": "m1", "ids": ["v1-7"], "k": 1},
            timeout=60,
        )
        if got.status_code == 200:
            break
        time.sleep(1)
    assert got.json()["hits"] == [[{"id": "v1-7", "score": 0.0}]], got.text
    too_many = httpx.post(
        f"{url}/second/v1/search",
        json={"gallery": "g", "model": "m1", "ids": ["v1-7"], "k": 4},
        timeout=60,
    )
    assert too_many.status_code == 400 and "from 1 to 3" in too_many.json()["error"]
