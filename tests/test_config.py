"""Config file + environment + flags into Settings; invalid config is one line naming the key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.config_load import load_settings
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
    ("prot = 1\n", "prot: unknown key (did you mean 'port'?)"),
    ("serach_mode = 'dense'\n", "serach_mode: unknown key (did you mean 'search_mode'?)"),
    ('[[workspace]]\nagent = "a"\npath = "/x"\napend = true\n',
     "workspace.0.apend: unknown key (did you mean 'append'?)"),
    ('bm25 = { stemer = false }\n', "bm25.stemer: unknown key (did you mean 'stemmer'?)"),
    ('[[workspace]]\nagent = "a"\n', "workspace.0.path: Field required"),
    ('[workspace]\nagent = "a"\npath = "/x"\n',
     "workspace: write [[workspace]] (double brackets: one table per agent)"),
    ("port = \n", "invalid TOML"),
    ('qdrant_quantization = "pq"\n', "qdrant_quantization: Input should be 'none' or 'int8'"),
    ("qdrant_replication_factor = 0\n", "qdrant_replication_factor: Input should be greater than or equal to 1"),
    ('collection_prefix = "My Host"\n', "collection_prefix: String should match pattern"),
    ('[[workspace]]\nagent = "a"\npath = "/x"\n[[workspace]]\nagent = "a"\npath = "/y"\n', "agent ids must be unique"),
    ('[[workspace]]\nagent = "a"\npath = "/x"\nmultimodal = { modalities = ["Video!"] }\n',
     "workspace.0.multimodal.modalities.0: String should match pattern"),
    ('bm25 = { tokenizer = "whitespace" }\n', "bm25.tokenizer: Input should be 'multilingual' or 'word'"),
])
def test_invalid_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config)


def test_an_environment_override_error_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('search_mode = "dense"\n')
    monkeypatch.setenv("QMD_INDEXER_SEARCH_MODE", "bogus")
    with pytest.raises(ConfigError) as error:
        load_settings(config)
    assert str(error.value).startswith("QMD_INDEXER_SEARCH_MODE (environment): search_mode: Input should be "
                                       "'hybrid', 'dense' or 'keyword'"), error.value
    assert str(config) not in str(error.value)


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("QMD_INDEXER_DEFAULT_AGENT", "bob", "default_agent: unknown agent 'bob'"),
    ("QMD_INDEXER_TOKEN", "short", "token: must be at least 16 characters"),
    ("QMD_INDEXER_TOKEN_FILE", "/nonexistent/token", "cannot read token_file"),
])
def test_the_checks_after_parsing_name_the_variable_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        variable: str, value: str, says: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[[workspace]]\nagent = "main"\npath = "{tmp_path}"\n')
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings(config)
    assert str(error.value).startswith(f"{variable} (environment): ") and says in str(error.value), error.value
    assert str(config) not in str(error.value)


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


def test_server_settings_reach_the_store_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer.store import ServerOptions

    config = tmp_path / "config.toml"
    config.write_text('qdrant_url = "http://qdrant:6333"\nqdrant_shard_number = 3\nqdrant_replication_factor = 2\n'
                      'qdrant_write_consistency_factor = 2\nqdrant_on_disk_vectors = true\n'
                      'qdrant_quantization = "int8"\nqdrant_max_request_mb = 1.5\n')
    monkeypatch.setenv("QMD_INDEXER_QDRANT_PREFER_GRPC", "true")
    options = ServerOptions.from_settings(load_settings(config))
    assert options == ServerOptions(prefer_grpc=True, max_request_bytes=int(1.5 * 1024 * 1024), shard_number=3,
                                    replication_factor=2, write_consistency_factor=2, on_disk_vectors=True,
                                    quantization="int8", tenancy="auto")


def test_bm25_settings_shape_the_keyword_terms(tmp_path: Path) -> None:
    from indexer.bm25 import Bm25Terms
    from indexer.config import Bm25

    config = tmp_path / "config.toml"
    config.write_text("bm25 = { stemmer = false }\n")
    settings = load_settings(config)
    assert settings.bm25 == Bm25(stemmer=False)
    stemmed = Bm25Terms(Bm25()).document("running runners run")
    plain = Bm25Terms(settings.bm25).document("running runners run")
    assert stemmed and plain
    assert len(set(stemmed[0])) < len(set(plain[0]))  # the stemmer folds running/run together


TOKEN = "s3cret-token-0123456789abcdef"


def _secret_file(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_token_from_a_file_the_environment_or_systemd_credentials(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``token_file`` (in the config or ``QMD_INDEXER_TOKEN_FILE``) names a file holding the token (a trailing newline
    is dropped); under systemd ``LoadCredential=token:...`` hands it over as ``$CREDENTIALS_DIRECTORY/token``."""
    monkeypatch.delenv("QMD_INDEXER_TOKEN", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    secret = _secret_file(tmp_path / "token", TOKEN + "\n", 0o600)
    config = _secret_file(tmp_path / "config.toml", f'token_file = "{secret}"\n', 0o644)  # no secret in it
    assert load_settings(config).token == TOKEN
    monkeypatch.setenv("QMD_INDEXER_TOKEN_FILE", str(secret))
    assert load_settings(tmp_path / "config.toml").token == TOKEN
    monkeypatch.delenv("QMD_INDEXER_TOKEN_FILE")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    _secret_file(credentials / "token", TOKEN, 0o400)
    _secret_file(credentials / "qdrant_api_key", "qdrant-key", 0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    plain = _secret_file(tmp_path / "plain.toml", "port = 9000\n", 0o644)
    settings = load_settings(plain)
    assert (settings.token, settings.qdrant_api_key) == (TOKEN, "qdrant-key")


@pytest.mark.parametrize(("config", "token_mode", "message"), [
    (f'token = "{TOKEN}"\n', None, r"permissions 0644 are too open for a config file that holds token"),
    (f'qdrant_api_key = "{TOKEN}"\n', None, r"permissions 0644 are too open for a config file that holds "
                                              r"qdrant_api_key"),
    ('qdrant_url = "http://qdrant:hunter2@qdrant.lan:6333"\n', None,
     r"0644 are too open for a config file that holds a password in qdrant_url: .* qdrant_api_key_file"),
    ('[plugin.openai]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\napi_key = "sk-in-the-file"\n', None,
     r"0644 are too open for a config file that holds plugin.openai.api_key: .* name it with api_key_env"),
    ('token_file = "{token}"\n', 0o640, r"permissions 0640 are too open for token_file"),
    ('token_file = "{token}"\n', 0o604, r"permissions 0604 are too open for token_file"),
    ('token_file = "{token}.missing"\n', 0o600, "cannot read token_file"),
])
def test_secrets_readable_by_others_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str,
                                                 token_mode: int | None, message: str) -> None:
    """Like ssh with a loose key: a token file, or a config file holding a secret, that group or others can read is
    refused with one line naming the file and the fix (a config without a secret may stay 0644)."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("QMD_INDEXER_TOKEN", raising=False)
    token = tmp_path / "token"
    if token_mode is not None:
        _secret_file(token, TOKEN, token_mode)
    path = _secret_file(tmp_path / "config.toml", config.replace("{token}", str(token)), 0o644)
    with pytest.raises(ConfigError, match=message) as error:
        load_settings(path)
    assert "\n" not in str(error.value)
    if token_mode is None:  # the same file readable by its owner alone is accepted
        path.chmod(0o600)
        load_settings(path)


def test_cli_exits_2_on_a_loose_config_holding_a_token(tmp_path: Path) -> None:
    config = _secret_file(tmp_path / "config.toml", f'token = "{TOKEN}"\n[[workspace]]\nagent = "a"\npath = "/tmp"\n',
                          0o644)
    result = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "chmod 600" in lines[0] and lines[0].startswith("qmd-indexer: config error"), lines


def test_a_token_and_a_token_file_at_once_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMD_INDEXER_TOKEN", TOKEN)
    secret = _secret_file(tmp_path / "token", TOKEN, 0o600)
    config = _secret_file(tmp_path / "config.toml", f'token_file = "{secret}"\n', 0o644)
    with pytest.raises(ConfigError, match="token: set token or token_file, not both"):
        load_settings(config)
