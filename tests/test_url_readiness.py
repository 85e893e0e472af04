"""Readiness of a ``url`` target on a real local HTTP server: ``auto`` takes /health, else
/v1/models; ``http`` takes the statuses it is given (a sick server answering 500 can be
load-tested); ``completion`` asks for one token; ``none`` checks nothing; a server that never
gets ready is a clear error; the run records what answered."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.servers import UrlTargetConfig
from tests.conftest import run_cli
from zwcore import TargetError


class Answers(ThreadingHTTPServer):
    """Answers each path with the status in ``statuses`` (404 for others); keeps the paths
    and bodies asked for."""

    def __init__(self, statuses: dict[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.statuses = statuses
        self.asked: list[tuple[str, str, bytes]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Answers

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.asked.append((self.command, self.path, body))
        status = self.server.statuses.get(self.path, 404)
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answers() -> Iterator[type[Answers]]:
    started: list[Answers] = []

    def make(statuses: dict[str, int]) -> Answers:
        server = Answers(statuses)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in started:
        server.shutdown()
        server.server_close()


def _start(url: str, tmp_path: Path, **kw: object) -> dict[str, object]:
    config = UrlTargetConfig(kind="url", url=url, served_model_name="m", **kw)  # type: ignore[arg-type]
    target = config.build()
    target.start(tmp_path)
    return target.describe()["readiness"]  # type: ignore[no-any-return]


def test_auto_takes_health_then_models(answers, tmp_path):
    server = answers({"/health": 200})
    facts = _start(server.url, tmp_path)
    assert facts["kind"] == "auto" and facts["result"].startswith("GET /health answered 200")
    server = answers({"/v1/models": 200})  # no /health: 404
    facts = _start(server.url, tmp_path)
    assert facts["result"].startswith("GET /v1/models answered 200 (GET /health: 404)")


def test_a_server_never_ready_is_an_error_naming_the_last_answer(answers, tmp_path):
    server = answers({"/health": 500, "/v1/models": 500})
    with pytest.raises(TargetError) as err:
        _start(server.url, tmp_path, startup_timeout_s=1.0)
    message = str(err.value)
    assert "not ready within 1 s by readiness 'auto'" in message
    assert "GET /v1/models answered 500 (GET /health: 500)" in message
    assert "[target] readiness" in message


def test_http_statuses_let_a_sick_server_be_load_tested(answers, tmp_path):
    server = answers({"/health": 500})
    readiness = {"kind": "http", "path": "/health", "statuses": [200, 500]}
    facts = _start(server.url, tmp_path, readiness=readiness)
    assert facts["result"].startswith("GET /health answered 500")
    assert facts["statuses"] == [200, 500]


def test_completion_asks_for_one_token_of_the_model(answers, tmp_path):
    server = answers({"/v1/completions": 200})
    facts = _start(server.url, tmp_path, readiness={"kind": "completion"})
    assert facts["result"].startswith("POST /v1/completions (max_tokens 1) answered 200")
    method, path, body = server.asked[-1]
    assert (method, path) == ("POST", "/v1/completions")
    assert json.loads(body) == {"model": "m", "prompt": "ready?", "max_tokens": 1, "stream": False}


def test_none_checks_nothing(answers, tmp_path):
    server = answers({})
    facts = _start(server.url, tmp_path, readiness={"kind": "none"})
    assert facts["result"].startswith("not checked") and server.asked == []


def test_bad_readiness_is_a_validation_error_naming_the_kind():
    with pytest.raises(ValueError, match="readiness"):
        UrlTargetConfig(kind="url", url="http://127.0.0.1:1", served_model_name="m",
                        readiness={"kind": "bogus"})  # fmt: skip
    with pytest.raises(ValueError, match="statuses"):
        UrlTargetConfig(kind="url", url="http://127.0.0.1:1", served_model_name="m",
                        readiness={"kind": "http", "statuses": [99]})  # fmt: skip


def test_a_plan_whose_target_never_got_ready_says_why_in_its_junit(answers, tmp_path):
    """No run began: the plan's junit.xml still carries the failure, for CI to show."""
    server = answers({"/health": 500, "/v1/models": 500})
    scenario = tmp_path / "never-ready.toml"
    scenario.write_text(
        'name = "never-ready"\nrepeats = 2\n'
        f'[target]\nkind = "url"\nurl = "{server.url}"\nserved_model_name = "m"\n'
        "startup_timeout_s = 1\n"
        '[[groups]]\nname = "g"\nusers = 1\nrequests_per_user = 1\nmax_tokens = 4\n'
    )
    done = run_cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "never-ready (repeats): " in done.stderr and "not ready within 1 s" in done.stderr
    junit = next((tmp_path / "out").glob("never-ready/*/junit.xml")).read_text()
    assert 'errors="1"' in junit and "not ready within 1 s" in junit
