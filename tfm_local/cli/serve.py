"""tfm-serve: an OpenAI-compatible HTTP API (chat and text completions) on a local GGUF target.

The model loads before the server binds, so ``GET /health`` answers only once
requests can be served. Requests are served one at a time in arrival order.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from urllib.parse import urlsplit

from .common import LOSSLESS, add_engine_args, check_weaver_use, engine_from_args, fail

#: Default request body limit: far above any prompt that fits a context (a 128k-token prompt is
#: about 0.5 MB of text), far below what a flood of bodies would cost in memory.
DEFAULT_MAX_BODY_BYTES = 4 << 20


def origin_arg(text: str) -> str:
    """``--cors-origin`` value: ``*`` or an origin, ``scheme://host[:port]`` (no path: a browser's Origin
    header never has one, so such a value would never match)."""
    u = urlsplit(text)
    if text != "*" and not (u.scheme and u.netloc and not (u.path or u.query or u.fragment)):
        raise argparse.ArgumentTypeError(f"expected an origin like http://localhost:3000 (no path, no trailing "
                                         f"slash) or '*', got {text!r}")
    return text


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tfm-serve", description="Serve a local GGUF model through an "
                                 "OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models), "
                                 "decoded speculatively with a DFlash drafter. " + LOSSLESS)
    add_engine_args(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    ap.add_argument("--api-key", default=os.environ.get("TFM_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1 (default: $TFM_API_KEY, else no key)")
    ap.add_argument("--model-name", default=None,
                    help="model id reported by /v1/models and expected in requests (default: the target file's stem)")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                    help="largest request body accepted, in bytes; a larger one is a 413 error, refused before "
                         f"it is read (default {DEFAULT_MAX_BODY_BYTES} = 4 MiB)")
    ap.add_argument("--cors-origin", action="append", type=origin_arg, default=[], metavar="ORIGIN",
                    help="let web pages from ORIGIN (e.g. http://localhost:3000; '*' for any) call the API from a "
                         "browser (CORS); repeat for several (default: none)")
    ap.add_argument("--no-truncate", action="store_true",
                    help="refuse (400 context_length_exceeded) a chat request whose conversation leaves no room "
                         "for the answer, instead of leaving its oldest turns out (the default: the leading system "
                         "messages and the last turn stay, max_tokens of room is kept, at most half the context; "
                         "the answer then carries X-TFM-Dropped-Messages and usage.tfm.dropped_messages)")
    ap.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                    help="server log level (default info: one line per request)")
    return ap.parse_args(argv)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0 = any free port), ready for uvicorn to listen on.

    Bound before the model loads, so a taken port fails at once. Raises OSError.
    """
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv=None) -> None:
    args = parse_args(argv)
    if not 0 <= args.port <= 65535:
        fail(f"--port must be in 0..65535, got {args.port}")
    if args.model_name is not None and not args.model_name.strip():
        fail("--model-name must not be empty")
    if args.max_body_bytes < 1:
        fail(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if args.api_key is not None and not args.api_key.strip():
        fail("--api-key (or $TFM_API_KEY) is empty (an unset variable?): give a key, or leave both out "
             "to serve without one")
    from ..server import create_app, serve

    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        fail(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    check_weaver_use(args)
    engine = engine_from_args(args)
    name = args.model_name or engine.target.model.path.stem
    app = create_app(engine, name, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                     cors_origins=args.cors_origin, truncate=not args.no_truncate)
    host, port = sock.getsockname()[:2]
    base = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    print(f"tfm-serve: {name} on {base}/v1{' (API key required)' if args.api_key else ''}; chat page: {base}/",
          file=sys.stderr, flush=True)
    try:
        serve(app, sock, log_level=args.log_level)  # returns on SIGTERM or Ctrl-C, after a graceful stop
    finally:
        sock.close()
        if not app.state.service.runner.busy:  # else a worker thread may still be in a step: leave it to exit
            engine.close()  # idempotent; the app's shutdown normally closed it already


if __name__ == "__main__":
    main()
