"""Send-Q observation from /proc/net/tcp, against real sockets."""

import os
import socket
import time

from netem import parse_proc_net_tcp, tcp_sockets

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
SAMPLE = (
    HEADER
    + """  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0100007F:D431 01 0000A000:00000010 01:00000014 00000000     0        0 2 1
"""
)


def test_parse_proc_net_tcp_decodes_addresses_ports_and_queues():
    listen, conn = parse_proc_net_tcp(SAMPLE)
    assert (listen.local_addr, listen.local_port, listen.state) == ("127.0.0.1", 8080, "LISTEN")
    assert (conn.remote_addr, conn.remote_port) == ("127.0.0.1", 0xD431)
    assert conn.state == "ESTABLISHED"
    assert conn.send_q_bytes == 0xA000 and conn.recv_q_bytes == 0x10
    assert (listen.inode, conn.inode) == (1, 2)


def test_send_q_of_a_real_stalled_connection():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.setblocking(False)
    sent = 0
    try:
        while True:
            sent += conn.send(b"x" * 65536)
    except BlockingIOError:
        pass
    time.sleep(0.2)
    sockets = [s for s in tcp_sockets(local_port=port) if s.state == "ESTABLISHED"]
    assert len(sockets) == 1
    assert sockets[0].remote_port == client.getsockname()[1]
    # Unread data sits in the server's Send-Q (and the client's small Recv-Q).
    assert sockets[0].send_q_bytes > 0
    assert sockets[0].send_q_bytes <= sent
    # the process that holds it names the same inode (how a proxy's own sockets are told)
    assert os.readlink(f"/proc/self/fd/{conn.fileno()}") == f"socket:[{sockets[0].inode}]"
    for s in (conn, client, server):
        s.close()
