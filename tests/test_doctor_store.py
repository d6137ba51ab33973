"""``qmd-indexer doctor`` on a real Qdrant server (``qdrant_url`` set): where each collection's points live, the
server unreachable, points in the layout not configured, a shared collection made by hand, a rebuild's leftovers and
a model change not yet swapped in; and doctor never writes to the server.

The session's server is shared by every test: each test here names its agent at random and its model by a
directory of its own (``model = <tmp_path>/model``: the model identity, hence the shared collections' names, is this
test's alone; doctor reads the identity, it never loads the model), and deletes the collections it created.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner, Result
from conftest import write

from indexer.cli import main
from indexer.config import Settings
from indexer.config_load import load_settings
from indexer.doctor_store import configured_identity
from indexer.points import Payload, Point, point_id
from indexer.state import Plan
from indexer.statedir import record_identity
from indexer.store import ServerOptions, ServerStore
from indexer.store.layout import shared_collection

PREFIX = "doc-"  # the config's collection_prefix: doctor must name the collections as the daemon does


def _names(url: str) -> list[str]:
    return [c["name"] for c in httpx.get(f"{url}/collections", timeout=10).json()["result"]["collections"]]


def _server_state(url: str) -> dict[str, Any]:
    """Every collection with its point count, payload indexes and HNSW settings: what a write would change."""
    out: dict[str, Any] = {}
    for name in sorted(_names(url)):
        info = httpx.get(f"{url}/collections/{name}", timeout=10).json()["result"]
        out[name] = (info["points_count"], info["payload_schema"], info["config"]["hnsw_config"])
    return out


@pytest.fixture(name="url")
def url_fixture(qdrant_server: Any) -> Iterator[str]:
    """The session's server; the collections a test creates are deleted after it, the others left as they were."""
    before = set(_names(qdrant_server.url))
    yield qdrant_server.url
    for name in set(_names(qdrant_server.url)) - before:
        httpx.delete(f"{qdrant_server.url}/collections/{name}", timeout=30).raise_for_status()


def _config(tmp_path: Path, url: str, tenancy: str) -> tuple[Path, Settings]:
    """A config of one agent (a random id) on ``url`` with ``tenancy``, and its settings."""
    agent = f"a{uuid.uuid4().hex[:10]}"
    workspace = tmp_path / "workspace"
    write(workspace / "MEMORY.md", "# Memory\n\nThe agent keeps bees.\n")
    (tmp_path / "model").mkdir()
    config = write(tmp_path / "config.toml", f'state_dir = "{tmp_path / "state"}"\nqdrant_url = "{url}"\n'
                   f'qdrant_tenancy = "{tenancy}"\ncollection_prefix = "{PREFIX}"\nmodel = "{tmp_path / "model"}"\n'
                   f'[[workspace]]\nagent = "{agent}"\npath = "{workspace}"\n')
    config.chmod(0o600)
    return config, load_settings(config)


def _names_of(settings: Settings) -> tuple[str, str, str]:
    """The agent, and its root and dir collections as the daemon names them."""
    root, directory = Plan.of(settings).collections[:2]
    assert root.name.startswith(PREFIX + "memory-root-")
    return root.agent, root.name, directory.name


def _points(collection: str, agent: str, n: int) -> list[Point]:
    out = []
    for i in range(n):
        payload = Payload(agent=agent, collection=collection, abs_path=f"/w/{i}.md", path=f"{i}.md", file_hash="h",
                          chunk_index=0, chunk_count=1, size_bytes=10, mtime_ns=5, kind="markdown", text=f"note {i}")
        out.append(Point(point_id(collection, f"/w/{i}.md", 0), {"text": np.asarray([1.0, 0.0, float(i)], np.float32)},
                         {"bm25": ([1], [1.0])}, payload))
    return out


def _fill(url: str, tenancy: str, space: str, name: str, agent: str, n: int, into: str | None = None) -> None:
    """``n`` points of logical collection ``name`` written by the daemon's own store (``into``: a rebuild's
    collection of it)."""
    store = ServerStore(url, options=ServerOptions(tenancy=tenancy, space=space))
    try:
        store.ensure_collection(into or name, {"text": 3})
        store.upsert(into or name, _points(name, agent, n))
    finally:
        store.close()


def _doctor(config: Path, *flags: str) -> Result:
    return CliRunner().invoke(main, ["doctor", "--config", str(config), *flags])


@pytest.mark.parametrize("tenancy", ["collections", "shared"])
def test_doctor_says_where_each_collections_points_live_and_writes_nothing(tmp_path: Path, url: str,
                                                                          tenancy: str) -> None:
    config, settings = _config(tmp_path, url, tenancy)
    agent, root, directory = _names_of(settings)
    space = configured_identity(settings)
    _fill(url, tenancy, space, root, agent, 3)
    before = _server_state(url)
    done = _doctor(config)
    assert done.exit_code == 0, done.output
    assert _server_state(url) == before, "doctor wrote to the server"
    lines = done.output.splitlines()
    if tenancy == "shared":
        digest = shared_collection(root, space).rpartition("-")[2]
        assert f'qdrant layout: {url} (tenancy "shared": tenants of qmd-shared-<kind>-{digest}, the shared ' \
               f"collections of model {space})" in lines
        assert f"{agent}: stored: {root} (3 points, tenant of {shared_collection(root, space)})" in lines
        assert f"{agent}: stored: {directory} (0 points: no tenant of that name in " \
               f"{shared_collection(directory, space)})" in lines
    else:
        assert f'qdrant layout: {url} (tenancy "collections": one Qdrant collection per logical collection)' in lines
        assert f"{agent}: stored: {root} (3 points in Qdrant collection {root})" in lines
        assert f"{agent}: stored: {directory} (0 points: no Qdrant collection {directory})" in lines
    assert f"{agent}: ok (" in done.output


def test_an_unreachable_server_is_one_line_and_a_failure(tmp_path: Path) -> None:
    from server_process import free_port

    port = free_port()  # nothing listens there
    config, _ = _config(tmp_path, f"http://doctor:s3cret@127.0.0.1:{port}", "shared")
    done = _doctor(config)
    assert done.exit_code == 1, done.output
    said = [line for line in done.output.splitlines() if "qdrant" in line]
    assert len(said) == 1 and said[0].startswith(f"qdrant unreachable: http://127.0.0.1:{port} ("), done.output
    assert "Traceback" not in done.output and "s3cret" not in done.output


def test_a_server_that_refuses_the_first_request_is_one_line_and_a_failure(tmp_path: Path) -> None:
    """A server that wants an API key the config does not give answers 401 to the first request, made while tenancy
    ``auto`` is settled: doctor says so in one line, no traceback."""
    from qdrant.fixtures import make_node, running

    with running(make_node(tmp_path / "locked", QDRANT__SERVICE__API_KEY="a-key-not-configured")) as node:
        config, _ = _config(tmp_path, node.url, "auto")
        done = _doctor(config)
    assert done.exit_code == 1, done.output
    said = [line for line in done.output.splitlines() if "qdrant" in line]
    assert len(said) == 1 and said[0].startswith(f"qdrant unreachable: {node.url} ("), done.output
    assert "401" in said[0] and "Traceback" not in done.output


@pytest.mark.parametrize("configured,other", [("shared", "collections"), ("collections", "shared")])
def test_points_only_in_the_other_layout_are_a_problem_naming_migrate(tmp_path: Path, url: str, configured: str,
                                                                     other: str) -> None:
    config, settings = _config(tmp_path, url, configured)
    agent, root, _ = _names_of(settings)
    space = configured_identity(settings)
    _fill(url, other, space, root, agent, 4)
    where = f"tenant of {shared_collection(root, space)}" if other == "shared" else f"in Qdrant collection {root}"
    before = _server_state(url)
    for flags in ((), ("--fix",)):  # --fix leaves the store alone
        done = _doctor(config, *flags)
        assert done.exit_code == 1, done.output
        assert f"{agent}: other layout: {root} (4 points{',' if other == 'shared' else ''} {where} and none in the " \
               f'configured layout (tenancy "{configured}"): the daemon would index everything again; move them ' \
               f"with `qmd-indexer migrate --from {url} --tenancy {configured}`)" in done.output.splitlines()
        assert _server_state(url) == before
    # once the configured layout holds them too, what is left in the other is information
    _fill(url, configured, space, root, agent, 4)
    done = _doctor(config)
    assert done.exit_code == 0, done.output
    assert f'{agent}: other layout: {root} (4 points' in done.output and f'unused with tenancy "{configured}"' in \
        done.output


def test_a_shared_collection_made_by_hand_without_per_tenant_indexing_is_a_problem(tmp_path: Path, url: str) -> None:
    config, settings = _config(tmp_path, url, "shared")
    agent, root, directory = _names_of(settings)
    space = configured_identity(settings)
    by_hand = shared_collection(root, space)
    created = httpx.put(f"{url}/collections/{by_hand}", timeout=30,
                        json={"vectors": {"text": {"size": 3, "distance": "Cosine"}}, "sparse_vectors": {"bm25": {}}})
    created.raise_for_status()
    _fill(url, "shared", space, directory, agent, 2)  # the dir one as the daemon makes it
    before = _server_state(url)
    done = _doctor(config)
    assert done.exit_code == 1, done.output
    assert _server_state(url) == before, "doctor added an index"
    problem = [line for line in done.output.splitlines() if line.startswith("shared collection not per tenant: ")]
    assert len(problem) == 1 and problem[0].startswith(f"shared collection not per tenant: {by_hand} (no is_tenant "
                                                       'keyword index on "collection"'), done.output
    assert "HNSW m=16, payload_m=None: not one graph per tenant" in problem[0]
    assert shared_collection(directory, space) not in problem[0]
    # given the index, and the HNSW settings the daemon uses, it is fine
    httpx.put(f"{url}/collections/{by_hand}/index", timeout=30, json={
        "field_name": "collection", "field_schema": {"type": "keyword", "is_tenant": True}}).raise_for_status()
    httpx.patch(f"{url}/collections/{by_hand}", timeout=30,
                json={"hnsw_config": {"m": 0, "payload_m": 16}}).raise_for_status()
    done = _doctor(config)
    assert done.exit_code == 0 and "not per tenant" not in done.output, done.output


@pytest.mark.parametrize("tenancy", ["collections", "shared"])
def test_points_left_in_a_rebuilds_staging_collection_are_information(tmp_path: Path, url: str,
                                                                      tenancy: str) -> None:
    config, settings = _config(tmp_path, url, tenancy)
    agent, root, _ = _names_of(settings)
    space = configured_identity(settings)
    _fill(url, tenancy, space, root, agent, 2)
    staging = f"{root}--rebuild-1"
    _fill(url, tenancy, space, root, agent, 3, into=staging)
    done = _doctor(config)
    assert done.exit_code == 0, done.output
    where = f", tenant of {shared_collection(staging, space)}" if tenancy == "shared" else \
        f" in Qdrant collection {staging}"
    assert f"{agent}: rebuild staging: {root} (3 points{where}: a rebuild cut short, or running now; the daemon " \
           f"deletes them at its next start)" in done.output.splitlines()
    assert f"{agent}: stored: {root} (2 points" in done.output


def test_tenants_still_in_a_former_models_shared_collection_are_information(tmp_path: Path, url: str) -> None:
    config, settings = _config(tmp_path, url, "shared")
    agent, root, directory = _names_of(settings)
    space = configured_identity(settings)
    former, stray = f"old-model#{uuid.uuid4().hex}", f"stray-model#{uuid.uuid4().hex}"
    settings.state_dir.mkdir(parents=True)
    record_identity(settings.state_dir, [root, directory], former)  # what the state dir says it was built with
    _fill(url, "shared", former, root, agent, 2)
    _fill(url, "shared", stray, directory, agent, 1)
    done = _doctor(config)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert f"{agent}: stored: {root} (0 points: no tenant of that name in {shared_collection(root, space)})" in lines
    assert f"{agent}: former model: {root} (2 points, tenant of {shared_collection(root, former)}, the shared " \
           f"collection of model {former} (recorded in the state dir): a model change not yet swapped in; searches " \
           f"answer from there until the rebuild into {shared_collection(root, space)} is swapped in, then these " \
           "are deleted)" in lines
    assert f"{agent}: other model: {directory} (1 point, tenant of {shared_collection(directory, stray)}" in \
        done.output
    assert "other layout" not in done.output


def test_a_model_that_cannot_be_named_is_a_problem_and_the_rest_is_still_checked(tmp_path: Path, url: str) -> None:
    config, settings = _config(tmp_path, url, "shared")
    config.write_text('plugins = ["no-such-plugin"]\n' + config.read_text())  # the allow-list names no plugin
    agent, root, _ = _names_of(settings)
    _fill(url, "shared", f"some-model#{uuid.uuid4().hex}", root, agent, 2)
    done = _doctor(config)
    assert done.exit_code == 1, done.output
    lines = done.output.splitlines()
    assert any(line.startswith("model unknown: ConfigError: ") and "no-such-plugin" in line for line in lines), lines
    assert f'qdrant layout: {url} (tenancy "shared": tenants of qmd-shared-<kind>-<model digest> collections; the ' \
           "model is unknown)" in lines
    assert any(line.startswith(f"{agent}: stored: {root} (2 points, tenant of qmd-shared-root-") for line in lines)
