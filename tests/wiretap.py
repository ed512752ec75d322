"""A loopback TCP relay that records every byte a site sends to the server."""

from __future__ import annotations

import socket
import threading


class Wiretap:
    """Relay ``127.0.0.1:<port>`` to ``target`` and keep what the clients sent."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.sent = bytearray()  # client -> server
        self.received = bytearray()  # server -> client
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, self.sent),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.received),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.server.close()
