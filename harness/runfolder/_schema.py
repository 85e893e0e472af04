"""The schema of ``summary.json``: a run's figures per user group, of the server, of the proxy,
of the load processes, and its verdicts. Latencies in ms, rates in tokens/s, sizes in bytes,
KV usage in percent (``docs/run-folder.md`` lists every field).

These models are the figure namespace (:mod:`harness.runfolder._figures`): gates, baselines,
comparisons and reports all read a run through them; :mod:`harness.analysis` fills them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field


class ProcessSaturation(BaseModel):
    """Figures of one load process (one ``pid`` in one file). CPU in percent of one core, lag
    in ms, fractions in 0..1 of the process's samples; ``group`` is the file name without the
    ``saturation-`` prefix and the ``.jsonl`` suffix."""

    group: str
    path: str
    pid: int
    samples: int
    span_s: float  # from the first sample to the last
    cpu_p50_pct: float
    cpu_max_pct: float
    loop_lag_p50_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    over_cpu_fraction: float  # samples with cpu_pct > cpu_limit_pct
    over_lag_fraction: float  # samples with loop_lag_ms > lag_limit_ms
    over_any_fraction: float  # samples over either limit
    saturated: bool  # over_any_fraction > max_fraction


class SaturationSummary(BaseModel):
    """Whether any load process was saturated, with the limits applied and per-process figures.

    ``unsampled`` lists files that were missing, empty or held no valid sample line.
    """

    cpu_limit_pct: float
    lag_limit_ms: float
    max_fraction: float
    processes: list[ProcessSaturation]
    unsampled: list[str]
    saturated: bool
    message: str


PROBE_COLUMNS = frozenset(
    {"t", "hop", "rss_bytes", "buffered_bytes", "client_send_q_bytes", "upstream_recv_q_bytes",
     "metrics_ok"}
)  # fmt: skip
"""Columns of ``proxy.parquet`` that the proxy probe fills itself; any other is a hop's own
metric figure (``run.json`` ``proxy_hops[].metric_figures`` declares it). A declared figure of
one of these names (egress's ``buffered_bytes`` gauge) feeds the probe's column, not
:attr:`HopSummary.metrics`."""


def hop_metric_name(figure: str, kind: str) -> str:
    """The name a hop's own metric ``figure`` of ``kind`` (``counter`` or ``gauge``) takes in
    :attr:`HopSummary.metrics`: a counter's rise is ``<figure>``, a gauge's peak
    ``<figure>_peak``."""
    return figure if kind == "counter" else f"{figure}_peak"


class HopSummary(BaseModel):
    """One proxy on the path from the clients to the target (``index`` 0 faces the clients; a
    single proxy is hop 0, a chain's hops follow inward): its kind and the port it listened on.
    Sizes in bytes; ``None`` where not observable or not sampled.

    From the run's socket samples (``sockets.parquet``): ``send_q_peak_bytes``, the peak over
    sample times of the Send-Q summed over its connections on that port (bytes it had written
    toward the hop in front of it, or the clients, not yet taken), and ``samples``, the sample
    times that saw the port.

    From its probe (``proxy.parquet``, ``probe_samples`` rows): ``rss_peak_bytes`` (its process
    tree), ``buffered_peak_bytes`` (bytes it held in user space: a gauge of its own, or its
    spill files; ``None`` where not observable), ``client_send_q_peak_bytes`` (the largest
    Send-Q of one of its connections toward the hop in front, or a client),
    ``upstream_recv_q_peak_bytes`` (the largest Recv-Q of one connection toward its upstream,
    the next hop or the target) and ``metrics``, its own metrics as its kind declares them
    (``ProxyConfigBase.metric_figures``): a counter's rise over the run by the figure's name
    (``requests``), a gauge's peak as ``<figure>_peak`` (``open_connections_peak``)."""

    index: int
    kind: str
    port: int
    send_q_peak_bytes: int | None
    samples: int
    rss_peak_bytes: int | None = None
    buffered_peak_bytes: int | None = None
    client_send_q_peak_bytes: int | None = None
    upstream_recv_q_peak_bytes: int | None = None
    probe_samples: int = 0
    metrics: dict[str, float] = {}


class ProxySummary(BaseModel):
    """Figures of the proxy of one run (of a chain: its first hop's, the one facing the
    clients). Sizes in bytes; ``None`` when not observable for this kind (``none`` has no
    process; nginx has no per-stream buffer figure). ``cuts`` and
    ``upstream_aborts`` are the egress buffer's counters' rises over the run, ``cut_reasons``
    the cuts by reason (``stall_timeout``: a client acknowledged nothing for
    ``stall_timeout_s`` while it owed bytes; ``overflow``: the stream's buffer filled up)."""

    name: str
    kind: str
    rss_peak_bytes: int | None
    buffered_peak_bytes: int | None
    stream_buffered_peak_mean_bytes: float | None
    client_send_q_peak_bytes: int | None
    upstream_recv_q_peak_bytes: int | None
    cuts: float | None
    upstream_aborts: float | None
    samples: int
    cut_reasons: dict[str, float] = {}
    hops: list[HopSummary] = []
    """Every hop, from the clients' side inward: a chain's, or the single proxy as hop 0 (empty
    for ``none``, and in summaries of single proxies written before hops were probed)."""


class WorkerClock(BaseModel):
    """A worker's clock measured by its master (``loadgen._clock``): ``offset_s`` (its
    monotonic clock minus the harness's, s; its records were moved by it), ``bound_ms`` (how
    far it may be off at any of the ``bursts`` of pings), ``rtt_min_ms`` (the shortest ping
    round trip), ``samples`` (answers)."""

    offset_s: float
    bound_ms: float
    rtt_min_ms: float
    samples: int
    bursts: int


class LoadWorker(BaseModel):
    """What became of one Locust worker of a group.

    ``status``: ``finished`` (ran until its master quit it), ``died`` (its process ended
    early, or its master lost its heartbeat), ``never_joined`` (started here and never
    announced itself to the master, or expected remote workers that never came: then
    ``worker`` is ``"(N remote)"``). ``requests_recorded``: complete lines in its records file, i.e.
    requests it had finished (in-flight requests of a killed worker are lost).
    """

    group: str
    worker: str
    host: str | None
    pid: int | None
    status: Literal["finished", "died", "never_joined"]
    detail: str
    requests_recorded: int
    clock: WorkerClock | None = None
    """Set for a worker on a clock of its own (one that forwards its lines: ``zerowindow
    worker``); workers the harness starts share its clock."""

    @property
    def message(self) -> str:
        """One line for the run's failure, e.g. ``load worker w2 of group fast was killed by
        SIGKILL after 7 recorded requests``."""
        text = f"load worker {self.worker} of group {self.group} {self.detail}"
        if self.status == "never_joined":
            return text
        return f"{text} after {self.requests_recorded} recorded requests"


class GroupSummary(BaseModel):
    """Figures of one user group. Latencies in ms; ``None`` when nothing was measured.

    Stalled streams (their client's ``stall``/``stop_reading`` action fired): ``stalled``
    counts them; ``cut_seen`` those whose client saw the server (or proxy) end the connection
    before the response was complete, ``cut_rst`` those that saw a RST; ``stall_to_cut_*_ms`` is
    the time from stall onset to the client seeing RST or FIN; ``engine_aborted`` and
    ``stall_to_abort_*_ms`` say when the engine aborted them: from the engine's own records
    when it wrote them (``engine_requests.parquet``), else estimated (``harness.analysis``:
    aborts are counted from the engine's gauges and matched to streams in order, to within one
    scrape interval).
    """

    group: str
    user_class: str | None
    requests: int
    outcomes: dict[str, int]
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    inter_chunk_p50_ms: float | None
    inter_chunk_p99_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    output_tokens: int
    output_tokens_per_s: float | None
    server_send_q_peak_bytes: int | None
    inter_chunk_mean_ms: float | None = None
    whole_answers: int = 0
    """Requests whose answer was asked for whole (``stream = false``): their TTFT is the whole
    answer's arrival, and they have no ITL."""
    stalled: int = 0
    cut_seen: int = 0
    cut_rst: int = 0
    stall_to_cut_p50_ms: float | None = None
    stall_to_cut_max_ms: float | None = None
    engine_aborted: int = 0
    stall_to_abort_p50_ms: float | None = None
    stall_to_abort_max_ms: float | None = None
    # Clients that left (the ``leave`` action; ``harness.analysis._leaves``): how many, how many
    # of them the engine aborted, leave-to-abort and leave-to-KV-free times, tokens generated
    # that the client never received (wasted decode), and the phase each was in when it left.
    left: int = 0
    left_aborted: int = 0
    # Left while the engine still had the request (queued, prefill, decode), never aborted: it
    # ran to the end for nobody; None when the phase of a client that left is unknown.
    zombies: int | None = 0
    leave_to_abort_p50_ms: float | None = None
    leave_to_abort_p90_ms: float | None = None
    leave_to_abort_max_ms: float | None = None
    leave_to_kv_free_p50_ms: float | None = None
    tokens_after_leave_mean: float | None = None
    leave_phases: dict[str, int] = Field(default_factory=dict)
    # The kernel's time-limited-by-the-client's-receive-window per request (tcpi_rwnd_limited).
    server_rwnd_limited_p50_ms: float | None = None
    server_rwnd_limited_max_ms: float | None = None
    # How the client stamped its reads (requests.parquet's ``timestamps``): requests whose every
    # read carried the kernel's arrival time, and the longest a kernel-stamped read waited.
    requests_kernel_stamped: int = 0
    read_lag_max_ms: float | None = None
    # Open loop (``arrival``): the client's send lag (t_send - t_scheduled), the rate it sent
    # at, and latencies counted from the scheduled send (free of coordinated omission).
    send_lag_p50_ms: float | None = None
    send_lag_p99_ms: float | None = None
    send_lag_max_ms: float | None = None
    sent_rps: float | None = None
    ttft_from_scheduled_p50_ms: float | None = None
    ttft_from_scheduled_p99_ms: float | None = None
    e2e_from_scheduled_p50_ms: float | None = None
    e2e_from_scheduled_p99_ms: float | None = None
    # Sessions (``session``): sessions begun, sessions that sent every turn (their last
    # record's ``session_end`` is ``done``), and the duration of those, from their first send
    # to their last turn's end (s). Per turn: the summaries ``<group>.turn1`` and
    # ``<group>.later_turns``.
    sessions: int = 0
    sessions_complete: int = 0
    session_duration_p50_s: float | None = None
    session_duration_p99_s: float | None = None
    # Returning turns (turn 2 on) with engine records, after a prompt that filled a block; those
    # that found fewer of their prompt's
    # tokens in the engine's prefix cache than the previous turn's prompt filled in full blocks
    # (the session's blocks were evicted between the turns), their share (0..1), and that share
    # among turns that came back after a turn the client stalled (None: no such turn).
    returning_turns: int = 0
    prefix_evicted: int = 0
    prefix_evicted_ratio: float | None = None
    prefix_evicted_after_stall_ratio: float | None = None
    # The engine's prefix cache (its own records): prompt tokens served from it at first
    # scheduling, summed, and their share of the prompt tokens of the same requests (0..1);
    # None without engine records that say.
    prompt_cached_tokens: int | None = None
    prefix_hit_ratio: float | None = None


class ServerSummary(BaseModel):
    """Server figures from its /metrics, or from the engine's own steps when it wrote them
    (``figures_source``). ``preemptions`` is the counter's rise over the run;
    ``missing_metrics`` names figures the server never reported; ``scrape_gap_max_s`` is the
    longest time between two scrapes (a starved harness samples less often than configured, and
    peaks between two scrapes are missed). ``request_success`` is each counter's rise over the
    run. ``generation_tokens`` is the rise of the engine's generated-token counter;
    ``undelivered_tokens`` the output tokens it generated that no client received (the wasted
    decode of stalled streams: see ``harness.analysis._stalls``)."""

    kv_cache_usage_peak_perc: float | None
    preemptions: float | None
    running_peak: float | None
    waiting_peak: float | None
    request_success: dict[str, float]
    scrapes: int
    failed_scrapes: int
    scrape_gap_max_s: float | None
    missing_metrics: list[str]
    generation_tokens: float | None = None
    undelivered_tokens: float | None = None
    # "engine_probe" when the peak KV usage, preemptions and peak running/waiting come from
    # the engine's own steps (engine_steps.parquet) instead of the scrapes; the scrapes' peak
    # KV is then kept beside it.
    figures_source: str = "scrapes"
    scraped_kv_cache_usage_peak_perc: float | None = None
    engine_steps: int | None = None
    # From the engine's steps: the most KV blocks held by requests at once (what KV usage and
    # every KV verdict count), and the most blocks free but kept for reuse by the prefix cache
    # (reusable by a request with the same prefix, evicted by any allocation): not in use.
    kv_blocks_in_use_peak: float | None = None
    kv_blocks_cached_free_peak: float | None = None
    # The engine's main process, sampled with the scrapes when the run started it: its thread
    # count (first sample and peak) and resident memory (peak, and growth over the first
    # sample, MB = 1e6 bytes); llama-server's slots busy at once.
    server_threads_start: float | None = None
    server_threads_peak: float | None = None
    server_rss_peak_mb: float | None = None
    server_rss_growth_mb: float | None = None
    slots_busy_peak: float | None = None


class MatrixCell(BaseModel):
    """One cell of the disconnect matrix (``harness.analysis._matrix``), or its control
    window (``phase`` and ``leave`` ``"control"``: victims alone); ``answer``: its leavers'
    answers streamed (``stream``) or asked whole (``whole``). Window times are s from the
    run's first send; latencies ms. ``clients``: the cell's clients (requests sent), ``left``
    of them left (``stayed``: the outcomes of the others, e.g. ``timeout`` for one whose
    deadline came before its first token); ``phases``: where the engine had each client when
    it left (its own records); ``aborted``: clients the engine aborted, ``leave_to_abort_*``
    their times from leaving; ``never_aborted`` = ``left - aborted``, of which ``zombies`` left
    while the engine still had the request (the others left after it finished); ``victim_*``:
    the victims' requests sent in the window, ``victim_ttft_p99_ratio`` against the control
    window.

    ``exercised``: whether the cell did what it is named for: ``True`` when ``in_phase`` (at
    least one) of its clients left in its phase, ``False`` when none did (``reached_phase``:
    where most of them were instead, e.g. ``frontend`` for clients still waiting for a model
    lock, ``finished`` for clients that left after generation ended; ``None`` when none
    left), ``None`` when it cannot be told (some phases unknown; the control window).
    ``phase_source``: ``engine`` (its records) or ``client`` (without engine records, a client
    that had a token before leaving was past queue and prefill). In a cell that was not
    exercised the figures of :attr:`LEAVE_FIGURES` are ``None``: not measured; so is
    ``zombies`` without the engine's phases (a zombie left while the engine had its
    request)."""

    # The cell's figures about its leavers, named as a group's (``<cell>.<name>``).
    LEAVE_FIGURES: ClassVar[tuple[str, ...]] = (
        "zombies", "leave_to_abort_p50_ms", "leave_to_abort_p90_ms", "leave_to_abort_max_ms",
        "leave_to_kv_free_p50_ms", "tokens_after_leave_mean",
    )  # fmt: skip

    cell: str
    phase: str
    leave: str
    answer: Literal["stream", "whole"] = "stream"
    window_s: tuple[float, float]
    clients: int = 0
    left: int = 0
    stayed: dict[str, int] = Field(default_factory=dict)
    phases: dict[str, int] = Field(default_factory=dict)
    phase_source: Literal["engine", "client"] | None = None
    in_phase: int = 0
    exercised: bool | None = None
    reached_phase: str | None = None
    aborted: int = 0
    never_aborted: int = 0
    zombies: int | None = 0
    leave_to_abort_p50_ms: float | None = None
    leave_to_abort_p90_ms: float | None = None
    leave_to_abort_max_ms: float | None = None
    leave_to_kv_free_p50_ms: float | None = None
    tokens_after_leave_mean: float | None = None
    victim_requests: int = 0
    victim_ttft_p50_ms: float | None = None
    victim_ttft_p99_ms: float | None = None
    victim_itl_p99_ms: float | None = None
    victim_ttft_p99_ratio: float | None = None

    def figures(self) -> dict[str, float | None]:
        """The cell's own figures, ``<cell>.<name>`` (nothing for the control window), which
        take the place of its group's figures of the same names: ``exercised`` (1, 0, or
        ``None``: cannot be told), ``in_phase``, ``left_in.<phase>`` (clients that left in each
        phase the engine recorded), and :attr:`LEAVE_FIGURES` (``None``: not measured).
        A gate on a cell whose ``exercised`` is 0 is inconclusive
        (``harness.gates._evaluate``)."""
        if self.phase == "control":
            return {}
        name = self.cell
        out: dict[str, float | None] = {
            f"{name}.exercised": None if self.exercised is None else float(self.exercised),
            f"{name}.in_phase": float(self.in_phase),
        }
        out |= {f"{name}.left_in.{p}": float(n) for p, n in self.phases.items()}
        for f in self.LEAVE_FIGURES:
            value = getattr(self, f)
            out[f"{name}.{f}"] = None if value is None else float(value)
        return out


ACCELERATOR_COLUMNS = (
    "t", "gpu", "memory_used_bytes", "memory_total_bytes", "gpu_utilization_perc",
    "memory_utilization_perc",
)  # fmt: skip
"""Columns of ``accelerator.parquet``, one row per GPU and sample (NVML: ``harness.collectors``):
``t`` (monotonic s), ``gpu`` (NVML's device index), memory used and total (bytes), and the
percent of the sample period in which a kernel ran and in which device memory was read or
written (``None`` where the GPU does not report them)."""


class GpuSummary(BaseModel):
    """One GPU over the run, from its samples in ``accelerator.parquet``; ``name`` and ``uuid``
    from ``run.json``'s ``accelerator``. Sizes in bytes, utilization in percent (``None`` where
    the GPU did not report it)."""

    index: int
    name: str | None
    uuid: str | None
    memory_total_bytes: int
    memory_used_peak_bytes: int
    gpu_utilization_mean_perc: float | None
    samples: int


class AcceleratorSummary(BaseModel):
    """The GPUs of the machine the run ran on, where it has any (``None`` in
    :attr:`RunSummary.accelerator` where it has none). ``memory_used_peak_bytes``: the most
    memory one GPU had in use at a sample, the largest of the GPUs' peaks (all processes', not
    only the target's: NVML counts device memory, not owners)."""

    memory_used_peak_bytes: int
    gpus: list[GpuSummary]


class RunSummary(BaseModel):
    """The whole run's summary, as written to ``summary.json``."""

    scenario: str
    status: str  # "complete" | "failed" | "interrupted" | "killed"
    failure: str | None
    duration_s: float
    groups: list[GroupSummary]
    server: ServerSummary
    verdicts: dict[str, Any]
    client_saturation: SaturationSummary
    proxy: ProxySummary | None = None
    # With [netem] capture: per flow that saw a zero window, who advertised it, the time from
    # the first zero window to the RST and who sent it (netem._wire.stalled_flows).
    stalled_flows: list[dict[str, Any]] | None = None
    load_workers: list[LoadWorker] = []  # Locust workers of distributed groups (--workers)
    # The largest clock bound of workers on clocks of their own (ms; LoadWorker.clock); None
    # when every load process shared the harness's clock.
    clock_bound_ms: float | None = None
    matrix: list[MatrixCell] = []  # the disconnect matrix's control window and cells, in order
    accelerator: AcceleratorSummary | None = None  # None: no GPU, or no sample of one
