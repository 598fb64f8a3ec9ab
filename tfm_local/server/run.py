"""Serving the app with uvicorn, and stopping gracefully on SIGTERM or Ctrl-C.

uvicorn alone, on a shutdown signal, waits for running responses up to its
graceful-shutdown timeout and then cancels them mid-stream (a traceback in
the log, a truncated body for the client), and re-raises SIGTERM once done,
so the process dies of it. Here the signal first stops the EngineRunner: the
running generation ends before its next piece with an error event (or a
503), waiting requests get a 503, the connections close, the Engine is
closed, and ``serve`` returns.
"""
from __future__ import annotations

import signal
import socket
import threading

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server, stopping the EngineRunner as soon as a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, runner):
        super().__init__(config)
        self.runner = runner

    def handle_exit(self, sig: int, frame) -> None:
        self.runner.stop()
        super().handle_exit(sig, frame)


def _interrupt(sig: int, frame) -> None:
    raise KeyboardInterrupt


def serve(app, sock: socket.socket, log_level: str = "info") -> None:
    """Serve ``app`` (from ``create_app``) on the bound socket ``sock`` until SIGTERM or Ctrl-C.

    Returns after a graceful stop (see the module docstring); a second Ctrl-C forces it. The
    caller then exits with status 0.
    """
    server = _Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5),
                     app.state.service.runner)
    # uvicorn re-raises the signal it stopped on once it is done: SIGTERM then ends like Ctrl-C.
    main = threading.current_thread() is threading.main_thread()  # only there can signals be handled
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
