"""Sending a run's traces (``harness.analysis._otlp``) to an OTLP endpoint, over HTTP with
protobuf bodies, with the OpenTelemetry SDK's exporter (``opentelemetry-sdk``,
``opentelemetry-exporter-otlp-proto-http``): the same spans ``traces.otlp.json`` holds, so that
they open in Jaeger or Tempo beside the engine's own (vLLM's ``--otlp-traces-endpoint``).

Where to: the scenario's ``[traces] otlp_endpoint``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
else ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/traces`` appended (the OTLP exporter
specification's variables and default path,
https://opentelemetry.io/docs/specs/otel/protocol/exporter/). A sending that fails is a warning,
never a failed run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from harness.analysis import TRACE_SCOPE, TraceSpan

TRACES_PATH = "/v1/traces"
BATCH_SPANS = 512  # spans per request: well under the exporter's size limit


def traces_endpoint(configured: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The URL to ``POST`` traces to (module docstring), ``None`` when none is configured. A
    configured URL without a path (``http://127.0.0.1:4318``) gets OTLP/HTTP's ``/v1/traces``."""
    if configured:
        return configured + TRACES_PATH if urlsplit(configured).path in ("", "/") else configured
    if url := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return url
    if base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + TRACES_PATH
    return None


def _sdk_spans(spans: Sequence[TraceSpan], resource: dict[str, Any], version: str) -> list[Any]:
    """``spans`` as the SDK's ``ReadableSpan`` (what its exporters take)."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    res = Resource.create(resource)
    scope = InstrumentationScope(TRACE_SCOPE, version or None)
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    kinds = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER,
             "client": trace.SpanKind.CLIENT}  # fmt: skip
    out = []
    for s in spans:
        tid = int(s.trace_id, 16)
        context = trace.SpanContext(tid, int(s.span_id, 16), is_remote=False, trace_flags=flags)
        parent = (
            None
            if s.parent_span_id is None
            else trace.SpanContext(
                tid, int(s.parent_span_id, 16), is_remote=False, trace_flags=flags
            )  # fmt: skip
        )
        status = (
            trace.Status(trace.StatusCode.UNSET)
            if s.error is None
            else trace.Status(trace.StatusCode.ERROR, s.error)
        )
        out.append(ReadableSpan(
            s.name, context, parent, res, s.attributes, kind=kinds[s.kind], status=status,
            start_time=s.start_ns, end_time=s.end_ns, instrumentation_scope=scope,
        ))  # fmt: skip
    return out


class _Heard(logging.Handler):
    """Keeps what the exporter logged while sending (its first line names the cause)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def cause(self) -> str:
        return self.lines[0][:300] if self.lines else "the endpoint refused the spans"


def send_traces(
    spans: Sequence[TraceSpan],
    resource: dict[str, Any],
    version: str,
    endpoint: str,
    *,
    timeout_s: float = 10.0,
) -> str | None:
    """Send ``spans`` (with their ``resource`` attributes and zerowindow's ``version``) to
    ``endpoint`` (a URL, :func:`traces_endpoint`) in batches of :data:`BATCH_SPANS`, each
    request within ``timeout_s``. Returns ``None`` when every batch was accepted, else a
    one-line warning (the endpoint refused or did not answer; the SDK is not installed). Never
    raises for sending."""
    if not spans:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult
    except ImportError as exc:
        return f"traces not sent to {endpoint}: the OpenTelemetry SDK is not installed ({exc})"
    logger = logging.getLogger("opentelemetry.exporter.otlp.proto.http")
    heard = _Heard()
    logger.addHandler(heard)
    propagate, logger.propagate = logger.propagate, False  # its lines become the warning's cause
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
    sent = 0
    try:
        sdk = _sdk_spans(spans, resource, version)
        for i in range(0, len(sdk), BATCH_SPANS):
            batch = sdk[i : i + BATCH_SPANS]
            if exporter.export(batch) is not SpanExportResult.SUCCESS:
                return (
                    f"traces not sent to {endpoint} ({sent} of {len(spans)} spans sent within "
                    f"{timeout_s:g} s; traces.otlp.json holds them all): {heard.cause()}"
                )
            sent += len(batch)
    except Exception as exc:  # noqa: BLE001  # sending is never a failed run
        return f"traces not sent to {endpoint}: {type(exc).__name__}: {exc}"
    finally:
        exporter.shutdown()
        logger.removeHandler(heard)
        logger.propagate = propagate
    return None
