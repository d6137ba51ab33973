"""Settings: the one frozen object a TOML file, the environment and command-line flags are validated into (read
by ``indexer.config_load.load_settings``, which says where each comes from and how secrets are kept out of the
file). Unknown keys are errors, so a typo never silently falls back to a default. A plugin table's keys are checked
against the keys the plugin declares (``config_keys``, ``indexer.plugins``).

Example file (every key optional except a workspace's ``agent`` and ``path``)::

    state_dir = "/var/lib/qmd-indexer"
    port = 8743
    host = "127.0.0.1"               # anything else needs a token (QMD_INDEXER_TOKEN) and logs a warning
    token_file = "/etc/qmd-indexer/token"   # the API token, from a file readable by its owner alone (0600)
    default_agent = "main"           # the agent of requests that name none (needed with several agents)
    qdrant_url = ""                  # empty: embedded Qdrant Edge under state_dir; see the README for a server
    model = "all-MiniLM-L6-v2"
    precision = "auto"               # auto | fp32 | bf16 | int8 (text embedding arithmetic)

    [[workspace]]
    agent = "main"
    path = "~/agent"
    extra_paths = ["~/notes"]
    sessions = "~/.openclaw/agents/main/sessions"   # session transcripts: a third collection, sessions-<agent>
    multimodal = { enabled = true, modalities = ["image", "audio"] }
    append = true                    # let the agent append to memory/ (memory_append, POST /append); off by default
    timezone = "Europe/Lisbon"       # IANA name: which day's note memory/YYYY-MM-DD.md is; default the system's zone

    [plugin.clip]                    # config table handed to the plugin named "clip"
    model = "/opt/models/clip-ViT-B-32"
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "QMD_INDEXER_"
MIB = 1024 * 1024


def compile_patterns(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """The user's ``redact_patterns`` compiled (``indexer.redact`` applies them; the config checks them as it
    loads). Raises ``ValueError`` naming the first pattern that does not compile or that matches the empty string
    (it would redact nothing but mark every position)."""
    out = []
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        if compiled.fullmatch(""):
            raise ValueError(f"pattern {pattern!r} matches the empty string")
        out.append(compiled)
    return tuple(out)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/qmd-indexer`` (XDG Base Directory spec), else ``~/.local/state/qmd-indexer``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "qmd-indexer"


def default_model_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/qmd-indexer/models`` (XDG Base Directory spec), else ``~/.cache/qmd-indexer/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qmd-indexer" / "models"


#: a media kind as named in ``multimodal.modalities`` (declared by extractor plugins: ``media = True``)
MediaKind = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$")]


class Multimodal(BaseModel):
    """Per-workspace media indexing: off by default; ``modalities`` names media kinds (``"image"``, ``"audio"``:
    whatever the loaded extractor plugins declare as media), or ``["all"]``. Names are checked against the loaded
    plugins when the daemon opens (``Registry.check_multimodal``), since plugins, not this file, define them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    modalities: tuple[MediaKind, ...] = ("all",)
    max_file_bytes: int = Field(default=10 * MIB, gt=0)

    def allows(self, modality: str) -> bool:
        """Whether files of media kind ``modality`` (e.g. "image", "audio") are indexed in this workspace."""
        return self.enabled and ("all" in self.modalities or modality in self.modalities)


class Bm25(BaseModel):
    """Keyword-search (BM25) term settings, Qdrant's ``Bm25Config``: ``tokenizer`` ``multilingual`` (words for
    Latin scripts, dictionary segmentation for CJK) or ``word``; ``stemmer`` the language's Snowball stemmer (with
    English stopwords) or none; ``avg_len`` the average document length in terms that BM25 normalises by.
    Changing them needs a reindex (``--reindex``): stored points keep the terms they were written with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Literal["multilingual", "word"] = "multilingual"
    stemmer: bool = True
    avg_len: float = Field(default=256.0, gt=0)


class Workspace(BaseModel):
    """One agent's workspace: its id, its directory and optional extra files or directories."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str = Field(min_length=1)
    path: Path
    extra_paths: tuple[Path, ...] = ()
    # A folder of session transcripts (OpenClaw's ~/.openclaw/agents/<id>/sessions, Claude Code's
    # ~/.claude/projects/<project>): absolute, or relative to the config file that names it (to the workspace when
    # given as a setting in code), ~ expanded; its *.jsonl files whose content a
    # transcript format plugin recognises become the collection sessions-<agent> (indexer.sources.transcripts).
    sessions: Path | None = None
    # Tool results in transcripts are left out unless this is set; then each is cut to sessions_tool_result_chars.
    sessions_tool_results: bool = False
    sessions_tool_result_chars: int = Field(default=400, ge=1)
    # Transcripts last written more than this many days ago are dropped from the index (default: keep all).
    sessions_max_age_days: float | None = Field(default=None, gt=0)
    multimodal: Multimodal = Multimodal()
    watch: Literal["auto", "native", "poll"] = "auto"  # auto: poll roots on network/FUSE/VM-shared file systems
    # Appends to markdown files under memory/ (indexer.append): off unless set; refused with 403 otherwise.
    append: bool = False
    # The agent's time zone, an IANA name ("Europe/Lisbon"): the date of its daily note memory/YYYY-MM-DD.md.
    # Empty: the system's local zone.
    timezone: str = ""
    # Secrets in notes replaced by [redacted: kind] before indexing (indexer.redact); unset: the global setting.
    redact_secrets: bool | None = None

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: Path) -> Path:
        return Path(os.path.abspath(value.expanduser()))

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if value:
            from zoneinfo import ZoneInfo

            try:
                ZoneInfo(value)
            except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
                raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Lisbon or UTC)") from None
        return value


class Settings(BaseSettings):
    """All settings of one daemon. Units are in the names: seconds (``_s``), bytes (``_bytes``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    state_dir: Path = Field(default_factory=default_state_dir)
    host: str = "127.0.0.1"
    port: int = Field(default=8743, ge=1, le=65535)
    # bearer token for the HTTP API (QMD_INDEXER_TOKEN); required to bind a non-loopback host (see indexer.guard)
    token: str = Field(default="", repr=False)
    # or a file holding it (mode 0600 or stricter; a trailing newline is dropped); under systemd LoadCredential=token:
    # needs neither (read from $CREDENTIALS_DIRECTORY/token)
    token_file: Path | None = None
    # the agent a request without one is scoped to; with several agents and none set, such requests are refused
    default_agent: str = ""
    qdrant_url: str = ""
    qdrant_api_key: str = Field(default="", repr=False)
    qdrant_api_key_file: Path | None = None  # as token_file; credential name qdrant_api_key
    qdrant_timeout_s: float = Field(default=10.0, gt=0)
    # A Qdrant server or cluster (ignored for the embedded store). gRPC is faster for bulk upserts; REST is the default.
    qdrant_prefer_grpc: bool = False
    qdrant_grpc_port: int = Field(default=6334, ge=1, le=65535)
    # Upserts are split into requests of at most this many points and under the server's `max_request_size_mb`
    # (Qdrant's default: 32); a request over it is refused whole.
    qdrant_max_request_mb: float = Field(default=32.0, gt=0)
    qdrant_batch_points: int = Field(default=256, ge=1)
    # Applied when a collection is created, never to an existing one (a difference is logged: recreate it with
    # `--reindex` to apply). Cluster example: shard_number 3, replication_factor 2, write_consistency_factor 2.
    qdrant_shard_number: int | None = Field(default=None, ge=1)
    qdrant_replication_factor: int | None = Field(default=None, ge=1)
    qdrant_write_consistency_factor: int | None = Field(default=None, ge=1)
    # These two also apply to the embedded Qdrant Edge store (new collections only; see indexer.store.edge): the
    # original dense vectors on disk (memory-mapped), an int8 copy in RAM that searches use, rescored with the
    # originals. For large collections (issue 14's 1M chunks: `make bench` step 7 with --big-points).
    qdrant_on_disk_vectors: bool = False
    qdrant_quantization: Literal["none", "int8"] = "none"  # scalar int8 quantization of dense vectors (kept in RAM)
    # Qdrant server only: "collections" gives each agent's collections Qdrant collections of their own; "shared" makes
    # them tenants of shared collections, one per kind and embedding model (docs/operations.md, "Many agents");
    # "auto": "collections" where the server already holds these agents' collections so, else "shared".
    qdrant_tenancy: Literal["auto", "collections", "shared"] = "auto"
    # Qdrant Edge: a collection of at least this many points that has no HNSW index gets one, built by a child
    # process on a copy and swapped in (see indexer.store.edge); below it, or with 0, searches scan exactly.
    edge_hnsw_min_points: int = Field(default=20_000, ge=0)
    # Prepended to every collection name: daemons on several machines sharing one server keep apart even when
    # their agent ids are the same (e.g. "laptop-" -> "laptop-memory-root-main").
    collection_prefix: str = Field(default="", pattern=r"^[a-z0-9-]*$")
    model: str = "all-MiniLM-L6-v2"
    device: str = "cpu"
    batch_size: int = Field(default=32, ge=1)
    # text embedding arithmetic: auto = bf16 where the CPU has it, else int8 (ONNX Runtime) if its export passes
    # the quality check, else fp32 (docs/performance.md, `python -m benchmarks.embed_precision`).
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    # Where the text model's ONNX exports (query model, int8 model) are kept, shared by every state dir of this
    # user: exported once per model and machine (20-50 s), then a new state dir or a second agent starts in seconds.
    # They hold no notes. Default $XDG_CACHE_HOME/qmd-indexer/models, else ~/.cache/qmd-indexer/models.
    model_cache_dir: Path = Field(default_factory=default_model_cache_dir)
    settle_s: float = Field(default=1.0, ge=0)
    settle_max_s: float = Field(default=5.0, ge=0)  # saved often: indexed at least this often
    rescan_interval_s: float = Field(default=300.0, gt=0)
    # Embedded store writes are refused (logged once as state_dir_full, retried) while the state dir's file system
    # has less free space than this: Qdrant Edge writes through mmap, and a page it touches on a full disk kills
    # the process with SIGBUS. What a write touches is in docs/performance.md ("Qdrant Edge").
    state_min_free_bytes: int = Field(default=64 * MIB, ge=0)
    poll_interval_s: float = Field(default=2.0, gt=0)  # how often a polled root is compared with the disk
    max_file_bytes: int = Field(default=10 * MIB, gt=0)
    # Appends (workspaces with append = true): at most this many bytes of UTF-8 text a call (else 413), and no
    # append that would take the file past append_max_file_bytes (else 413; never past max_file_bytes either, so
    # the file stays indexable).
    append_max_bytes: int = Field(default=64 * 1024, gt=0)
    append_max_file_bytes: int = Field(default=2 * MIB, gt=0)
    # A session transcript is read streamed, so it may be larger than max_file_bytes, up to this.
    sessions_max_file_bytes: int = Field(default=256 * MIB, gt=0)
    # What search and recall look in when a request names no corpus: "all" (memory files and, where a workspace
    # configures `sessions`, its transcripts), "memory" or "sessions" (docs/configuration.md, "Session transcripts").
    default_corpus: Literal["all", "memory", "sessions"] = "all"
    search_mode: Literal["hybrid", "dense", "keyword"] = "hybrid"
    on_model_change: Literal["rebuild", "refuse"] = "rebuild"  # collections made by another model or chunking
    # Fusion and depth chosen with `make eval` (BEIR SciFact, hybrid nDCG@10, tuned on the train queries): dbsf
    # beats rrf, prefetch_limit 100 beats 50 (docs/performance.md, "Search defaults").
    fusion: Literal["rrf", "dbsf"] = "dbsf"
    rrf_k: int = Field(default=60, ge=1)
    prefetch_limit: int = Field(default=100, ge=1)
    # Cosine floor for image hits of a text query, applied before fusion. Text-image cosine similarities of CLIP
    # ViT-B/32 sit in a narrow band (roughly 0.1-0.35) where unrelated pairs usually stay under 0.2; not measured
    # here (no real CLIP weights on this machine), so tune it for your model.
    image_min_score: float = 0.2
    bm25: Bm25 = Bm25()
    # "Nothing relevant": a search answers relevant=false unless one of its first 3 hits (whatever k) has a raw
    # dense cosine reaching relevance_floor, holds relevance_coverage of the query's terms weighed by their IDF in
    # its agent's index, or is a note dated in the question's period (indexer.relevance.judge, each hit on its own
    # evidence, so one hit gets one verdict whatever corpus or k the request asks).
    # Measured with benchmarks/relevance_table.py: docs/performance.md, "Nothing relevant". Unset, the floor is the
    # text model's own (indexer.calibration): the one it declares (MiniLM 0.42, e5 0.83), else measured on a probe.
    relevance_floor: float | None = Field(default=None, ge=-1, le=1, allow_inf_nan=False)
    relevance_coverage: float = Field(default=0.5, ge=0, le=1)
    # Optional re-ranking of the fused hits, off by default (indexer.search.mmr / decay). MMR lowered nDCG@10 and
    # hit@5 on the devvault dev set, so it is off (docs/performance.md, "Search defaults").
    # Temporal decay of daily notes (memory/YYYY-MM-DD.md) by a half-life in days: the dev set has no dated notes,
    # so it is unmeasured and off.
    mmr_lambda: float | None = Field(default=None, ge=0, le=1)
    temporal_half_life_days: float | None = Field(default=None, gt=0)
    # Rerank stage (indexer.rerank), off by default: no cross-encoder weights ship in any package here, so nothing
    # is measured. `reranker` names a plugin of the qmd_indexer.rerankers entry-point group (built-in:
    # "cross-encoder", whose [plugin.cross-encoder] table gives `model`, a local model directory); it rescores the
    # first `rerank_top_n` fused hits. It fails open: when it raises, or scoring takes longer than `rerank_budget_s`
    # seconds, the fused order is returned and `status` counts it (status.rerank).
    reranker: str = ""
    rerank_top_n: int = Field(default=20, ge=1)
    rerank_budget_s: float = Field(default=2.0, gt=0)
    plugins: Annotated[tuple[str, ...], NoDecode] = ()
    prefer: dict[str, str] = {}
    plugin: dict[str, dict[str, Any]] = {}
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    workspace: tuple[Workspace, ...] = ()
    # Secrets (API keys, tokens, private keys, password= assignments: indexer.redact's table) replaced by
    # [redacted: kind] before anything is embedded, stored or shown. On by default: a key pasted into a note is as
    # exposed in an index as in a transcript. Transcripts are redacted whatever this says; a workspace may override
    # it for its notes. redact_patterns: more regular expressions, each matched within a line.
    redact_secrets: bool = True
    redact_patterns: tuple[str, ...] = ()

    @field_validator("redact_patterns")
    @classmethod
    def _compiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        compile_patterns(value)  # ValueError naming the pattern
        return value

    @field_validator("relevance_floor", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool):  # TOML true would read as 1.0: nothing relevant by meaning, silently
            raise ValueError("must be a cosine between -1 and 1, not true or false")
        return value

    @field_validator("plugins", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("state_dir", "token_file", "qdrant_api_key_file", "model_cache_dir")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else Path(os.path.abspath(value.expanduser()))

    @classmethod
    def settings_customise_sources(  # pydantic-settings' hook
        cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any, dotenv_settings: Any,
        file_secret_settings: Any,
    ) -> tuple[Any, ...]:
        # environment beats the file (which arrives as init kwargs); flags are applied after, in load_settings
        return (env_settings, init_settings)

