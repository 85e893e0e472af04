"""Command line of the egress buffer: ``python -m harness._egress --upstream URL [options]``.

``main(argv)`` is also what a wrapping CLI (``zerowindow serve egress``) can call.

``--upstream http://host:port`` (required), ``--listen HOST:PORT`` (default
127.0.0.1:8080), ``--metrics-listen HOST:PORT`` (default: no metrics listener); every other
``EgressConfig`` field is an option (``--buffer-bytes``, ``--overflow pause``,
``--stall-timeout-s 2``, ...). SIGTERM and SIGINT shut down gracefully (exit status 0); an
invalid option exits 2, a port that cannot be bound 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import pydantic

from harness._egress._config import EgressConfig
from harness._egress._server import serve
from harness._model_options import add_model_options
from zwcore import ProxyError

_SPECIAL = {"upstream_url", "listen_host", "listen_port", "metrics_host", "metrics_port"}


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or a bare ``PORT`` (on 127.0.0.1) as (host, port).

    Raises ``ValueError`` on anything else.
    """
    text = text.strip()
    if text.isdigit():
        return "127.0.0.1", int(text)
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host or ":" in host:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid port in {text!r}")
    return host, int(port)


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser(prog: str = "python -m harness._egress") -> argparse.ArgumentParser:
    """An argparse parser: --upstream, --listen, --metrics-listen, --log-level, and one
    option per other ``EgressConfig`` field; ``prog`` names the command in usage and errors."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="zerowindow egress buffer: a streaming reverse proxy that buffers in host "
        "memory and resets stalled clients",
    )
    parser.add_argument("--upstream", required=True, help="the one upstream: http://host:port")
    parser.add_argument(
        "--listen", type=_address, default=("127.0.0.1", 8080), help="HOST:PORT (port 0: any)"
    )
    parser.add_argument(
        "--metrics-listen",
        type=_address,
        default=None,
        help="HOST:PORT of the Prometheus metrics listener (default: none)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_model_options(parser, EgressConfig, skip=_SPECIAL)
    return parser


def config_from_args(args: argparse.Namespace) -> EgressConfig:
    """The ``EgressConfig`` of parsed arguments; raises ``pydantic.ValidationError``."""
    values = vars(args).copy()
    values.pop("log_level", None)
    host, port = values.pop("listen")
    metrics = values.pop("metrics_listen")
    fields: dict[str, Any] = {
        "upstream_url": values.pop("upstream"),
        "listen_host": host,
        "listen_port": port,
    }
    if metrics is not None:
        fields["metrics_host"], fields["metrics_port"] = metrics
    return EgressConfig(**fields, **values)


_OPTION_OF = {
    "upstream_url": "--upstream",
    "listen_host": "--listen",
    "listen_port": "--listen",
    "metrics_host": "--metrics-listen",
    "metrics_port": "--metrics-listen",
}


def _option_error(error: Any) -> str:
    """One pydantic error as ``--option: message`` (the option the field came from)."""
    field = str(error["loc"][0]) if error.get("loc") else ""
    option = _OPTION_OF.get(field, "--" + field.replace("_", "-"))
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{option}: {message}"


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m harness._egress") -> int:
    """Parse ``argv``, validate the config and serve until a signal; the exit status.
    ``prog``: the command's name in usage and error lines."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except pydantic.ValidationError as exc:
        parser.error("; ".join(_option_error(e) for e in exc.errors()))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    try:
        serve(config)
    except OSError as exc:
        print(f"egress: cannot listen: {exc}", file=sys.stderr)
        return 1
    except ProxyError as exc:
        print(f"egress: {exc}", file=sys.stderr)
        return 1
    return 0
