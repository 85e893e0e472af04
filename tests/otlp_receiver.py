"""A small real OTLP/HTTP traces receiver for the tests: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` body (``opentelemetry-proto``), answered with an empty
``ExportTraceServiceResponse`` (https://opentelemetry.io/docs/specs/otlp/#otlphttp), on
127.0.0.1 only. Every span received is kept, flattened with its resource's attributes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids as hex, times in Unix ns, attributes as Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _values(key_values: Any) -> dict[str, Any]:
    out = {}
    for kv in key_values:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@dataclass
class OtlpReceiver:
    """The receiver's server and what it got; :meth:`start`, :meth:`stop`."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The traces endpoint, ``http://127.0.0.1:PORT/v1/traces``."""
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def take(self, request: ExportTraceServiceRequest) -> None:
        got = [
            ReceivedSpan(
                s.trace_id.hex(),
                s.span_id.hex(),
                s.parent_span_id.hex(),
                s.name,
                s.kind,
                s.start_time_unix_nano,
                s.end_time_unix_nano,
                _values(s.attributes),
                _values(rs.resource.attributes),
            )  # fmt: skip
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        with self.lock:
            self.requests += 1
            self.spans.extend(got)

    def wait_for(self, predicate: Any, timeout_s: float) -> list[ReceivedSpan]:
        """The spans received once ``predicate(spans)`` holds, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
