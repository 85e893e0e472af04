"""Traces that line up (issue 31, item 3): every request's W3C ``traceparent``, the run's
``traces.otlp.json`` (one trace per request, client and engine spans), the same spans sent to a
real OTLP/HTTP receiver (``tests/otlp_receiver.py``), and vLLM's own spans in the same traces."""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness.analysis._otlp import request_spans
from harness.lifecycle import run_scenario
from harness.outputs import traces_endpoint
from harness.scenario import parse_scenario
from loadgen import RequestSpec, new_traceparent, trace_ids
from loadgen._request import request_bytes, target
from tests._sim_runs import sim_runs
from tests.conftest import run_cli
from tests.otlp_receiver import OtlpReceiver

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")  # W3C Trace Context, 3.2


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


def _spans(doc: dict) -> list[dict]:
    return [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def test_each_request_carries_a_fresh_traceparent():
    values = {new_traceparent() for _ in range(1000)}
    assert len(values) == 1000 and all(TRACEPARENT.match(v) for v in values)
    spec = RequestSpec(host="http://127.0.0.1:9", model="m", prompt="p", prompt_tokens=1)
    wire = request_bytes(spec, target(spec.host, spec.endpoint))
    assert f"traceparent: {spec.traceparent}\r\n".encode() in wire
    trace, span = trace_ids(spec.traceparent)
    assert spec.traceparent == f"00-{trace}-{span}-01"


def test_traces_endpoint_from_the_scenario_or_the_environment():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1/"}
    assert traces_endpoint("http://127.0.0.1:4318", env) == "http://127.0.0.1:4318/v1/traces"
    assert traces_endpoint("http://h:1/custom", env) == "http://h:1/custom"
    assert traces_endpoint(None, env) == "http://127.0.0.1:1/v1/traces"
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://127.0.0.1:2/t"
    assert traces_endpoint(None, env) == "http://127.0.0.1:2/t"
    assert traces_endpoint(None, {}) is None


def test_the_run_folder_holds_one_trace_per_request(tmp_path_factory):
    """The emulator's positive control (stalled readers whose KV is held): the OTLP/JSON file
    is a valid ExportTraceServiceRequest with one trace per request, in the request's own
    trace id under its client span, with client and engine spans."""
    run_dir = sim_runs(tmp_path_factory)["on_delivery"].run_dir
    doc = json.loads((run_dir / "traces.otlp.json").read_text())
    parsed = ExportTraceServiceRequest()
    json_format.ParseDict(_with_base64_ids(doc), parsed)  # the protocol's own schema
    requests = pd.read_parquet(run_dir / "requests.parquet")
    spans = _spans(doc)
    roots = {s["traceId"]: s for s in spans if "parentSpanId" not in s}
    assert set(roots) == set(requests["trace_id"]) and len(roots) == len(requests)
    assert {r["spanId"] for r in roots.values()} == set(requests["span_id"])
    ids = {s["spanId"] for s in spans}
    assert all(s.get("parentSpanId", s["spanId"]) in ids for s in spans)
    names = Counter(s["name"] for s in spans)
    for name in ("client connect", "client waiting", "client receiving", "engine request",
                 "engine queued", "engine prefill", "engine decode"):  # fmt: skip
        assert names[name] >= len(requests), (name, names)
    stalled = requests[requests["stall_s"] > 0]
    assert names["client stalled"] == len(stalled) > 0
    # KV released on delivery: the stalled readers' KV outlives their generation.
    held = {s["traceId"] for s in spans if s["name"] == "engine KV held"}
    assert set(stalled["trace_id"]) <= held
    for s in spans:
        assert int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) > 1.7e18


def _with_base64_ids(doc: dict) -> dict:
    """``doc`` with its hex ids as protobuf's JSON mapping reads bytes (base64)."""
    out = json.loads(json.dumps(doc))
    for span in _spans(out):
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return out


def test_analyze_sends_the_same_spans_to_the_otlp_endpoint(
    tmp_path_factory, tmp_path, receiver, monkeypatch
):
    run_dir = tmp_path / "run"
    shutil.copytree(sim_runs(tmp_path_factory)["on_finish"].run_dir, run_dir)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    result = run_cli("analyze", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    written = _spans(json.loads((run_dir / "traces.otlp.json").read_text()))
    got = {(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns)
           for s in receiver.spans}  # fmt: skip
    assert got == {
        (s["traceId"], s["spanId"], s.get("parentSpanId", ""), s["name"],
         int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
        for s in written
    }  # fmt: skip
    assert {s.resource["service.name"] for s in receiver.spans} == {"zerowindow"}


def test_an_endpoint_that_refuses_is_a_warning(tmp_path_factory, tmp_path, receiver, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(sim_runs(tmp_path_factory)["on_finish"].run_dir, run_dir)
    url = receiver.url.replace("/v1/traces", "/nowhere")  # answered 404
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    result = run_cli("analyze", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: traces not sent to {url} (0 of" in result.stdout + result.stderr
    assert (run_dir / "traces.otlp.json").is_file() and not receiver.spans


@pytest.mark.vllm
def test_vllm_spans_share_each_requests_trace(vllm_server, vllm_otlp, tmp_path):
    """A short run against the shared vLLM server, which exports its spans to the session's
    receiver; the run sends its own there too: each request's ``llm_request`` span is in the
    request's trace, a child of the client's span."""
    text = f"""
name = "traced"
cooldown_s = 0.5
[traces]
otlp_endpoint = "{vllm_otlp.url}"
[target]
kind = "url"
url = "{vllm_server}"
served_model_name = "tiny"
[[groups]]
name = "g"
users = 1
requests_per_user = 3
max_tokens = 4
"""
    result = run_scenario(parse_scenario(text, path=Path("t.toml")), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    requests = pd.read_parquet(result.run_dir / "requests.parquet")
    assert len(requests) == 3
    traces = dict(zip(requests["trace_id"], requests["span_id"], strict=True))

    def engine_spans(spans):
        return [s for s in spans if s.name == "llm_request" and s.trace_id in traces]

    spans = vllm_otlp.wait_for(lambda got: len(engine_spans(got)) >= 3, timeout_s=15)
    engine = engine_spans(spans)
    assert {s.trace_id for s in engine} == set(traces), [s.trace_id for s in engine]
    assert all(s.parent_span_id == traces[s.trace_id] for s in engine)
    client = {s.trace_id: s for s in spans if s.name == "request" and s.trace_id in traces}
    assert set(client) == set(traces)
    assert all(client[s.trace_id].span_id == s.parent_span_id for s in engine)
    for s in engine:  # vLLM's span inside the client's (wall clocks of one machine)
        assert client[s.trace_id].start_ns <= s.start_ns <= client[s.trace_id].end_ns


def test_a_cut_request_has_a_cut_span_and_an_error_status():
    trace, span = trace_ids(new_traceparent())
    row = {
        "trace_id": trace, "span_id": span, "t_send": 10.0, "t_connected": 10.001,
        "t_first_token": 10.2, "t_last_byte": 10.5, "t_cut_seen": 12.0, "t_end": 12.0,
        "cut_kind": "rst", "outcome": "cut_by_peer", "error": "ConnectionResetError",
    }  # fmt: skip
    spans = request_spans(row, None, [[10.5, None]], offset_s=1.7e9)
    by_name = {s.name: s for s in spans}
    assert list(by_name) == ["request", "client connect", "client waiting", "client receiving",
                             "client stalled", "client cut"]  # fmt: skip
    root = by_name["request"]
    assert root.span_id == span and root.error == "cut_by_peer: ConnectionResetError"
    assert by_name["client cut"].attributes == {"zerowindow.cut_kind": "rst"}
    assert by_name["client stalled"].end_ns - by_name["client stalled"].start_ns == 1_500_000_000
    assert by_name["client connect"].end_ns - root.start_ns == 1_000_000
