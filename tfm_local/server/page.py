"""The chat page: ``GET /`` and its two files, static package data of ``tfm_local/server/static/``.

The page (HTML, CSS and vanilla JavaScript, no build step) calls this server's own
``/v1/chat/completions`` and nothing else: every answer carries a Content-Security-Policy that lets
it load and connect to its own origin only, so it works offline and cannot be made to fetch from
elsewhere. The routes need no API key (they are outside ``/v1``); the page asks for the key when
the API answers 401.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

#: URL path → (file in static/, media type). Nothing else under static/ is served.
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/static/chat.css": ("chat.css", "text/css; charset=utf-8"),
         "/static/chat.js": ("chat.js", "text/javascript; charset=utf-8")}

#: Own origin only: scripts, styles and fetches from this server, no inline code, no framing.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@lru_cache(maxsize=None)
def page_file(name: str) -> bytes:
    """The bytes of ``static/<name>`` (read once). Raises FileNotFoundError when the package lacks it."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _route(name: str, media_type: str):
    """A route handler without parameters (so no query value reaches it) that answers one file."""
    async def serve() -> Response:
        return Response(page_file(name), media_type=media_type,
                        headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                 "Cache-Control": "no-cache"})
    return serve


def add_page_routes(app: FastAPI) -> None:
    """Add ``GET`` routes for the paths of ``FILES`` to ``app`` (left out of the OpenAPI schema)."""
    for path, (name, media_type) in FILES.items():
        app.add_api_route(path, _route(name, media_type), methods=["GET"], include_in_schema=False)
