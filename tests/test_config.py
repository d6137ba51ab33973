"""Config file + environment + flags into Settings; invalid config is one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from indexer.config import load_settings
from indexer.errors import ConfigError


def test_file_env_and_flags_in_order_of_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('port = 9001\nsettle_s = 2.5\n[[workspace]]\nagent = "a"\npath = "~/ws"\n'
                      'extra_paths = ["notes"]\nmultimodal = { enabled = true, modalities = ["image"] }\n')
    monkeypatch.setenv("QMD_INDEXER_SETTLE_S", "0.5")
    monkeypatch.setenv("QMD_INDEXER_PLUGINS", "clip, notes")
    settings = load_settings(config, {"port": 9100, "state_dir": None})
    assert settings.port == 9100  # flag beats file
    assert settings.settle_s == 0.5  # env beats file
    assert settings.plugins == ("clip", "notes")
    [ws] = settings.workspace
    assert ws.path == Path.home() / "ws"
    assert ws.multimodal.allows("image") and not ws.multimodal.allows("audio")


@pytest.mark.parametrize(("text", "message"), [
    ("port = 70000\n", "port: Input should be less than or equal to 65535"),
    ("prot = 1\n", "prot: unknown key"),
    ('[[workspace]]\nagent = "a"\n', "workspace.0.path: Field required"),
    ("port = \n", "invalid TOML"),
    ('[[workspace]]\nagent = "a"\npath = "/x"\n[[workspace]]\nagent = "a"\npath = "/y"\n', "agent ids must be unique"),
    ('[[workspace]]\nagent = "a"\npath = "/x"\nmultimodal = { modalities = ["Video!"] }\n',
     "workspace.0.multimodal.modalities.0: String should match pattern"),
    ('bm25 = { tokenizer = "whitespace" }\n', "bm25.tokenizer: Input should be 'multilingual' or 'word'"),
])
def test_invalid_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_settings(config)


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_cli_exits_2_with_one_line_on_bad_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('port = "many"\n[[workspace]]\nagent = "a"\npath = "/tmp"\n')
    result = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "port" in lines[0] and lines[0].startswith("qmd-indexer: config error")


def test_bm25_settings_shape_the_keyword_terms(tmp_path: Path) -> None:
    from indexer.config import Bm25
    from indexer.pipeline import make_bm25

    config = tmp_path / "config.toml"
    config.write_text("bm25 = { stemmer = false }\n")
    settings = load_settings(config)
    assert settings.bm25 == Bm25(stemmer=False)
    stemmed = make_bm25(Bm25()).embed_document("running runners run")
    plain = make_bm25(settings.bm25).embed_document("running runners run")
    assert len(set(stemmed.indices)) < len(set(plain.indices))  # the stemmer folds running/run together
