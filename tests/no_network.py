"""No network for a test: name lookups and TCP/IP connects fail; local (unix) sockets, which
wandb's own service uses, still work. `helpers.offline_env` applies it to a subprocess,
`helpers.go_offline` to the test process (there, a module that took its own reference with
`from socket import getaddrinfo` before the test keeps the real one)."""

import socket

_connect = socket.socket.connect


def refuse(*args, **kwargs):
    raise OSError("network disabled by the test")


def connect_locally(sock, address, *args):
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        refuse()
    return _connect(sock, address, *args)


REPLACEMENTS = [(socket.socket, "connect", connect_locally), (socket, "getaddrinfo", refuse)]


def disable() -> None:
    for owner, name, replacement in REPLACEMENTS:
        setattr(owner, name, replacement)
