"""The egress buffer's metrics listener: ``GET /metrics`` on its own port.

It serves ``_metrics.EgressMetrics`` in Prometheus text format, one request per connection,
and nothing else; the proxied listener forwards every path (``/metrics`` included) upstream.
"""

from __future__ import annotations

import asyncio

import h11

from harness._egress._http import simple_response
from harness._egress._metrics import CONTENT_TYPE, EgressMetrics


async def serve_scrape(
    metrics: EgressMetrics, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer one connection to the metrics listener: ``GET /metrics`` gets ``metrics``
    rendered (``CONTENT_TYPE``), any other path 404, any other method 405; then close."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=8192)
    try:
        async with asyncio.timeout(5.0):
            event = conn.next_event()
            while event is h11.NEED_DATA:
                conn.receive_data(await reader.read(8192))
                event = conn.next_event()
            if not isinstance(event, h11.Request):
                return
            if event.method != b"GET":
                writer.write(simple_response(conn, 405, "GET only"))
            elif event.target.split(b"?", 1)[0] != b"/metrics":
                writer.write(simple_response(conn, 404, "see /metrics"))
            else:
                body = metrics.render()
                head = h11.Response(
                    status_code=200,
                    headers=[
                        (b"content-type", CONTENT_TYPE.encode()),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                )
                writer.write(
                    (conn.send(head) or b"")
                    + (conn.send(h11.Data(data=body)) or b"")
                    + (conn.send(h11.EndOfMessage()) or b"")
                )
            await writer.drain()
    except (TimeoutError, h11.ProtocolError, OSError):
        pass
    finally:
        writer.close()
