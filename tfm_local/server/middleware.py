"""ASGI middleware of tfm-serve: the API key check and the request body limit.

Both answer before the route reads the body, with OpenAI-shaped error bodies (errors.APIError).
"""
from __future__ import annotations

import hashlib
import secrets

from .errors import APIError


class BearerAuth:
    """ASGI middleware: paths under ``/v1`` need ``Authorization: Bearer <api_key>``, else a 401 error body.

    The scheme is matched in any case ("bearer", RFC 7235); the key is compared in constant time
    (SHA-256 digests, so not even its length shows). It runs before the body is read, so a wrong
    key is a 401 whatever the body holds.
    """

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, hashlib.sha256(api_key.encode()).digest()

    def accepts(self, header: bytes) -> bool:
        """True when the Authorization header value is "Bearer" (any case), spaces, and the key."""
        scheme, _, key = header.partition(b" ")
        digest = hashlib.sha256(key.lstrip(b" ")).digest()
        return secrets.compare_digest(digest, self.expected) and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not self.accepts(given):
                what = "Incorrect API key provided" if given else "Missing API key"
                err = APIError(401, f"{what}: send 'Authorization: Bearer <key>' with the key "
                               "the server was started with (--api-key).", code="invalid_api_key")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` bytes is a 413 error body, never read whole.

    A Content-Length over the limit is answered at once, before any of the body is read. Otherwise
    (a chunked body, or a Content-Length that lies) the bytes are counted as the app reads them, and
    the read that passes the limit raises the 413 APIError, which the app's handler answers. The
    server reads the body only as fast as the app asks for it, so at most one more message
    (tens of kB) is held.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def error(self) -> APIError:
        """The 413 error body."""
        return APIError(413, f"The request body is larger than this server accepts ({self.max_bytes} bytes: "
                        "tfm-serve --max-body-bytes).", code="request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self.error().response()(scope, receive, send)
            return
        seen = 0

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self.error()
            return message

        await self.app(scope, counting_receive, send)
