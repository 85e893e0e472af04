"""What the network does: observation of the TCP sockets of the streams under test."""

from netem._sockets import TcpSocket, parse_proc_net_tcp, tcp_sockets

__all__ = ["TcpSocket", "parse_proc_net_tcp", "tcp_sockets"]
