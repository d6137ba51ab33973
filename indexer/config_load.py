"""Loading the settings: a TOML file, the environment and command-line flags, validated into the frozen ``Settings``
(``indexer.config``), the secrets read from files of their own.

Precedence, highest first: CLI flags, environment (``QMD_INDEXER_<KEY>``, e.g. ``QMD_INDEXER_PORT=9000``), the
config file, defaults. The config file is ``--config PATH``, else ``$QMD_INDEXER_CONFIG``, else
``$XDG_CONFIG_HOME/qmd-indexer/config.toml`` when it exists. Unknown keys are errors, so a typo never silently
falls back to a default. ``load_settings`` raises ``ConfigError`` whose message is one line naming the key.

Secrets (``token``, ``qdrant_api_key``) can come, besides the file and ``QMD_INDEXER_TOKEN``, from a file of their
own: ``token_file`` / ``qdrant_api_key_file`` (or ``QMD_INDEXER_TOKEN_FILE``...), else, under systemd,
``$CREDENTIALS_DIRECTORY/token`` / ``qdrant_api_key`` (``LoadCredential=token:/etc/qmd-indexer/token``). Like ssh
with a private key, a secret file that group or others can read (mode & 0o077) is refused, and so is a config
file that holds a secret itself: ``token``, ``qdrant_api_key``, a password inside ``qdrant_url``, or a plugin
table's ``api_key`` (or any key named ``password``, ``secret``, ``token`` or ending so); the message names the way
that keeps it out of the file. A config file without one may stay world-readable (0644, as examples are shipped).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from indexer.config import ENV_PREFIX, Settings
from indexer.errors import ConfigError, did_you_mean, unknown_agent

MIN_TOKEN_CHARS = 16
SECRETS = ("token", "qdrant_api_key")  # each may come from <key>_file or $CREDENTIALS_DIRECTORY/<key> instead
SECRET_WORDS = ("api_key", "password", "secret", "token")  # a plugin table's key named so, or ending so, holds one


def default_config_path() -> Path:
    """``$XDG_CONFIG_HOME/qmd-indexer/config.toml``, else ``~/.config/qmd-indexer/config.toml``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "qmd-indexer" / "config.toml"


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc`` (a validation error's location, less its last part) takes: ``Settings``'
    fields at the top, a ``[[workspace]]``'s, ``bm25``'s..."""
    model: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = next((a for a in (field.annotation, *get_args(field.annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _format_error(error: ValidationError, origin: str) -> str:
    """One line for ``error``: where the value came from (``origin``, or the environment variable that set it), the
    key, and what is wrong; an unknown key names the closest known one."""
    first = error.errors()[0]
    loc = tuple(first["loc"])
    key = ".".join(str(part) for part in loc) or "(top level)"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key" + did_you_mean(str(loc[-1]), _keys_at(loc[:-1]))
    elif loc == ("workspace",) and isinstance(first.get("input"), dict):  # ``[workspace]``: one table, not a list
        message = "write [[workspace]] (double brackets: one table per agent), not [workspace]"
    variable = ENV_PREFIX + str(loc[0]).upper() if loc else ""
    if variable and any(name.upper() == variable for name in os.environ):  # the environment beats the file
        origin = f"{variable} (environment)"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{origin}: {key}: {message}{more}"


def _too_open(path: Path) -> str | None:
    """``path``'s permission bits as ``"0644"`` when group or others have any, else ``None``."""
    mode = os.stat(path).st_mode & 0o777
    return f"{mode:04o}" if os.name == "posix" and mode & 0o077 else None


def _secrets_held(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The secrets a config file's ``data`` holds, each ``(what, the way to keep it out of the file)``."""
    held = [(key, f"move it to {key}_file (a file of mode 0600)") for key in SECRETS if data.get(key)]
    url = data.get("qdrant_url")
    if isinstance(url, str) and url:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            held.append(("a password in qdrant_url", "take it out of the URL and put Qdrant's API key in "
                                                     "qdrant_api_key_file (a file of mode 0600)"))
    plugins = data.get("plugin")
    for name, table in (plugins.items() if isinstance(plugins, dict) else []):
        for key, value in (table.items() if isinstance(table, dict) else []):
            if value and isinstance(value, str) and (key in SECRET_WORDS or key.endswith(SECRET_WORDS)):
                way = ("put it in an environment variable and name it with api_key_env" if key == "api_key"
                       else "put it in an environment variable or a file of mode 0600 the plugin reads")
                held.append((f"plugin.{name}.{key}", way))
    return held


def _read_secret(path: Path, key: str) -> str:
    """The secret in ``path`` (whitespace around it dropped); ``ConfigError`` when the file is missing, empty,
    unreadable or readable by group or others."""
    try:
        loose = _too_open(path)
        if loose:
            raise ConfigError(f"{path}: permissions {loose} are too open for {key}_file: it must be readable by its "
                              f"owner alone (chmod 600 {path})")
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {key}_file: {getattr(exc, 'strerror', None) or exc}") from None
    if not value:
        raise ConfigError(f"{path}: {key}_file is empty")
    return value


def _from(key: str, origin: str) -> str:
    """Where setting ``key``'s value came from: its environment variable (``QMD_INDEXER_<KEY> (environment)``) when
    that is set, since the environment beats the file, else ``origin``."""
    variable = ENV_PREFIX + key.upper()
    return f"{variable} (environment)" if any(name.upper() == variable for name in os.environ) else origin


def _with_secret_files(settings: Settings, origin: str) -> Settings:
    """``settings`` with each secret read from its ``<key>_file``, else from ``$CREDENTIALS_DIRECTORY/<key>`` when
    the secret is not set otherwise."""
    credentials = os.environ.get("CREDENTIALS_DIRECTORY", "")
    found: dict[str, str] = {}
    for key in SECRETS:
        file: Path | None = getattr(settings, f"{key}_file")
        if file is not None and getattr(settings, key):
            raise ConfigError(f"{_from(key, _from(key + '_file', origin))}: {key}: set {key} or {key}_file, not both")
        if file is None and not getattr(settings, key) and credentials and (Path(credentials) / key).exists():
            file = Path(credentials) / key
        if file is not None:
            try:
                found[key] = _read_secret(file, key)
            except ConfigError as exc:
                source = _from(key + "_file", origin)
                raise ConfigError(f"{source}: {exc}" if source != origin else str(exc)) from None
    return settings.model_copy(update=found) if found else settings


def _sessions_beside(data: dict[str, Any], path: Path) -> None:
    """Make each ``[[workspace]]``'s relative ``sessions`` in the config file at ``path`` absolute against the
    file's directory (where its writer looked from), ``~`` expanded; in place."""
    for table in data.get("workspace") or []:
        raw = table.get("sessions") if isinstance(table, dict) else None
        if isinstance(raw, str) and raw and not Path(raw).expanduser().is_absolute():
            table["sessions"] = os.path.abspath(path.parent / raw)


def load_settings(config_path: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read the config file (if any), the environment and ``overrides`` (CLI flags; ``None`` values ignored), and
    the secret files (``token_file``, ``$CREDENTIALS_DIRECTORY/token``...; see the module docstring).

    Raises ``ConfigError`` with one line such as ``config.toml: port: Input should be less than or equal to 65535``,
    or ``config.toml: permissions 0644 are too open for a config file that holds token: ...``.
    """
    env_path = os.environ.get(ENV_PREFIX + "CONFIG")
    explicit = config_path or (Path(env_path) if env_path else None)
    path = explicit or default_config_path()
    data: dict[str, Any] = {}
    if explicit is not None or path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    origin = str(path) if data else "config"
    _sessions_beside(data, path)
    held = _secrets_held(data)
    loose = _too_open(path) if held else None
    if loose:
        what, way = held[0]
        raise ConfigError(f"{path}: permissions {loose} are too open for a config file that holds {what}: "
                          f"chmod 600 {path}, or {way}")
    try:
        settings = Settings(**data)
        flags = {key: value for key, value in (overrides or {}).items() if value is not None}
        if flags:
            merged = settings.model_dump()
            merged.update(flags)
            settings = Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, origin)) from None
    settings = _with_secret_files(settings, origin)
    agents = [ws.agent for ws in settings.workspace]
    if len(set(agents)) != len(agents):
        raise ConfigError(f"{origin}: workspace.agent: agent ids must be unique, got {agents}")
    paths: dict[Path, str] = {}
    for ws in settings.workspace:
        if ws.path in paths:
            raise ConfigError(f"{origin}: workspace.path: agents {paths[ws.path]!r} and {ws.agent!r} share {ws.path}; "
                              f"each agent needs a workspace of its own (one agent's memory is never another's)")
        paths[ws.path] = ws.agent
    if settings.default_agent and settings.workspace and settings.default_agent not in agents:
        raise ConfigError(f"{_from('default_agent', origin)}: default_agent: "
                          f"{unknown_agent(settings.default_agent, agents)}")
    if settings.token and len(settings.token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{_from('token', origin)}: token: must be at least {MIN_TOKEN_CHARS} characters "
                          f"(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return settings
