"""Scenario files: what an experiment runs, as TOML validated by pydantic.

A scenario names a target (the server under test), one or more user groups (each a Locust
process of identical users with one read behaviour), and collector and verdict settings. See
``scenarios/slow-readers.toml`` for a commented example.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from harness._proxies import NoProxyConfig, ProxyConfig
from harness._sim import SimConfig
from loadgen import UserGroupConfig


class ScenarioError(Exception):
    """A scenario file that cannot be read or does not validate.

    ``str(error)`` names the file, the field, the line where it could be found, and what was
    expected, one problem per line.
    """


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VllmTargetConfig(_Strict):
    """Start a real vLLM OpenAI-compatible server for the run.

    ``model`` is a local path (relative paths are resolved against the current directory) or a
    model name the server can load. ``extra_args`` are passed to
    ``python -m vllm.entrypoints.openai.api_server`` as they are, e.g.
    ``["--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16"]``.
    """

    kind: Literal["vllm"]
    model: str
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    python: str | None = Field(None, description="interpreter with vLLM; default: this one")
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(300.0, gt=0)
    stop_grace_s: float = Field(10.0, gt=0)


class UrlTargetConfig(_Strict):
    """Attach to a server that is already running at ``url`` (scheme, host, port)."""

    kind: Literal["url"]
    url: str
    served_model_name: str
    startup_timeout_s: float = Field(30.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        expected = "expected http://HOST:PORT such as http://127.0.0.1:8000"
        try:
            url = urlsplit(value)
            url.port  # noqa: B018 - raises ValueError for a port that is not a number 0..65535
        except ValueError as exc:
            raise ValueError(f"{expected} ({exc})") from None
        if url.scheme != "http" or not url.hostname or value != value.strip():
            raise ValueError(f"{expected} (the load generator speaks plain HTTP/1.1)")
        if url.path.strip("/") or url.query or url.fragment or url.username:
            raise ValueError(f"{expected}, without path, query or fragment")
        return value.rstrip("/")


class SimTargetConfig(_Strict):
    """Start the built-in engine emulator for the run. ``engine`` holds its settings
    (``kv_release``, ``num_blocks``, ``block_size``, step-time model...; see
    ``harness._sim.SimConfig``)."""

    kind: Literal["sim"]
    served_model_name: str = "sim"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    engine: SimConfig = SimConfig()
    startup_timeout_s: float = Field(30.0, gt=0)
    stop_grace_s: float = Field(5.0, gt=0)


TargetConfig = Annotated[
    VllmTargetConfig | SimTargetConfig | UrlTargetConfig, Field(discriminator="kind")
]


class CollectorConfig(_Strict):
    """Sampling intervals of the server-side collectors, in seconds."""

    metrics_interval_s: float = Field(0.25, gt=0)
    sockets_interval_s: float = Field(0.1, gt=0)


class VerdictConfig(_Strict):
    """Settings of the "KV held by undelivered streams" verdict.

    The engine is taken to have finished generating when it reports no running request, or, if
    ``generation_bound_s`` is set, that many seconds after the first request was sent,
    whichever comes first. ``min_observe_s`` is how long undelivered data must be seen in
    Send-Q after that for a "none held" answer to count.
    """

    generation_bound_s: float | None = Field(None, gt=0)
    min_observe_s: float = Field(1.0, gt=0)


class Scenario(_Strict):
    """A whole experiment. ``proxy`` stands between the clients and the target (default: none).
    ``max_duration_s`` bounds the load phase; ``cooldown_s`` is how long the collectors keep
    sampling after the last load process ended."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    seed: int = 0
    max_duration_s: float = Field(600.0, gt=0)
    cooldown_s: float = Field(3.0, ge=0)
    target: TargetConfig
    proxy: ProxyConfig = NoProxyConfig()
    groups: list[UserGroupConfig] = Field(min_length=1)
    collectors: CollectorConfig = CollectorConfig()
    verdict: VerdictConfig = VerdictConfig()

    @model_validator(mode="after")
    def _groups_start_in_time(self) -> Scenario:
        late = [g.name for g in self.groups if g.start_after_s >= self.max_duration_s]
        if late:
            raise ValueError(
                f"groups {', '.join(late)} start_after_s is not below "
                f"max_duration_s={self.max_duration_s:g}"
            )
        return self

    @field_validator("groups")
    @classmethod
    def _unique_names(cls, groups: list[UserGroupConfig]) -> list[UserGroupConfig]:
        names = [g.name for g in groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"group names must be unique; repeated: {', '.join(duplicates)}")
        return groups


def _find_line(lines: list[str], loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line number (1-based) of the field at ``loc`` in a TOML text."""
    pos, line_no, table = 0, None, ""
    for part in loc:
        if isinstance(part, int):
            header = re.compile(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]")
            seen = -1
            for i in range(len(lines)):
                if header.match(lines[i]):
                    seen += 1
                    if seen == part:
                        pos, line_no = i + 1, i + 1
                        break
            else:
                return line_no
            continue
        table = f"{table}.{part}" if table else part
        key = re.compile(
            rf"^\s*(\[\[?\s*([\w.-]*\.)?{re.escape(part)}\s*\]\]?|{re.escape(part)}\s*=)"
            rf"|[{{,]\s*{re.escape(part)}\s*="
        )
        for i in range(pos, len(lines)):
            if key.search(lines[i]):
                pos, line_no = i, i + 1
                break
    return line_no


def _format_errors(path: Path, text: str, error: ValidationError) -> str:
    lines = text.splitlines()
    out = []
    for err in error.errors():
        raw = err["loc"]
        loc = tuple(
            p
            for i, p in enumerate(raw)
            if not (i > 0 and raw[i - 1] in _UNIONS and p in _UNION_TAGS)
        )
        field = ".".join(str(p) for p in loc) or "(top level)"
        # A missing field is not in the text: point at the table that lacks it.
        line = _find_line(lines, loc[:-1] if err["type"] == "missing" else loc)
        where = f"{path}:{line}" if line else str(path)
        got = ""
        if (
            err["type"] not in ("missing",)
            and "input" in err
            and not isinstance(err["input"], dict | list)
        ):
            got = f" (got {err['input']!r})"
        out.append(f"{where}: field '{field}': {err['msg']}{got}")
    return "\n".join(out)


# Discriminated-union fields, and the tags pydantic inserts after them in error locations.
_UNIONS = {"target", "proxy", "read", "action"}
_UNION_TAGS = {
    "none",
    "nginx",
    "haproxy",
    "envoy",
    "egress",
    "vllm",
    "sim",
    "url",
    "full_speed",
    "paced",
    "stall",
    "stop_reading",
    "half_close",
    "abortive_close",
}


def parse_scenario(text: str, *, path: Path) -> Scenario:
    """Validate the TOML ``text`` of the scenario file ``path``.

    Raises :class:`ScenarioError` naming file, line and field for TOML syntax errors and for
    every validation problem.
    """
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(path, text, exc)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Raises :class:`ScenarioError` (see :func:`parse_scenario`), also when the file cannot be read.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})"
        ) from None
    return parse_scenario(text, path=path)
