"""operations/util/ssh_socket.py: Nagle off on pyinfra's ssh socket, nothing done where there is no TCP socket."""

import socket
from types import SimpleNamespace

from operations.util.ssh_socket import send_without_delay


def host_with(sock):
    transport = SimpleNamespace(sock=sock)
    return SimpleNamespace(connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))


def test_nagle_is_turned_off_on_the_tcp_socket():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the default paramiko leaves
        assert send_without_delay(host_with(client)) is True
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_no_tcp_socket_is_left_alone():
    proxy = SimpleNamespace(send=lambda data: None)  # ssh through a ProxyCommand: a pipe, not a socket
    assert send_without_delay(host_with(proxy)) is False
    assert send_without_delay(SimpleNamespace(connector=SimpleNamespace())) is False  # @local, @docker
    not_connected = SimpleNamespace(connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: None)))
    assert send_without_delay(not_connected) is False
    a, b = socket.socketpair()  # a unix socket has no Nagle to turn off
    with a, b:
        assert send_without_delay(host_with(a)) is False
