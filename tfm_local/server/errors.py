"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

``APIError`` is raised by the routes; ``install_handlers`` maps it, FastAPI's
request validation errors (malformed JSON, wrong types, out-of-range values)
and Starlette's HTTP errors (unknown path, wrong method) to that shape, and
turns any other exception into a 500 ``server_error`` (logged; the server
keeps serving).
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("tfm_local.server")


class APIError(Exception):
    """An error answered to the client.

    Args:
        status: HTTP status (400 bad request, 401, 404 unknown model, 500, 503).
        message: human-readable text.
        type: OpenAI error type ("invalid_request_error", "authentication_error", "server_error").
        param: the offending request field (dotted path, list items as ``[i]``) or None.
        code: machine-readable code ("model_not_found", "context_length_exceeded", ...) or None.
    """

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        """The JSON body ``{"error": {...}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a JSON response with its status."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def loc_to_param(loc: tuple) -> str | None:
    """Pydantic error location → OpenAI ``param``: ('body', 'messages', 0, 'role') → 'messages[0].role'.

    Union and model-name segments pydantic inserts (``'str'``, ``'list[str]'``...) are dropped.
    """
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in ("str", "int", "float", "bool", "none", "function-after"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or None


def validation_error(errors: list[dict]) -> APIError:
    """A failed validation (pydantic's ``errors()`` list, FastAPI's or our own) as a 400.

    Malformed JSON and a non-object body are code ``invalid_json``; a missing field
    ``missing_required_parameter``; otherwise ``invalid_value`` with the first offending field
    as ``param`` (the alternatives of a union are listed together).
    """
    first = errors[0] if errors else {}
    kind = first.get("type")
    param = loc_to_param(tuple(first.get("loc", ())))
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "invalid JSON")
        return APIError(400, f"We could not parse the JSON body of your request ({detail}). "
                        "The body must be a JSON object.", code="invalid_json")
    if param is None:
        return APIError(400, "The request body must be a JSON object.", code="invalid_json")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    msgs = []
    for e in errors:
        p = loc_to_param(tuple(e.get("loc", ())))
        if p is not None and p.startswith(param):
            msgs.append(e.get("msg", "invalid") + (f" (at '{p}')" if p != param else ""))
    return APIError(400, f"Invalid value for '{param}': {'; or '.join(dict.fromkeys(msgs))}.", param=param,
                    code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    """Register the OpenAI-shaped handlers for APIError, validation errors, HTTP errors and the rest."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(list(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return APIError(404, f"Unknown request URL: {request.method} {request.url.path}.",
                            code="not_found").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect):
        # the client left while its body was read: one line, no traceback (the reply goes nowhere)
        log.info("client disconnected while sending %s %s", request.method, request.url.path)
        return APIError(400, "The client disconnected before the request body arrived.").response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return internal_error(exc).response()


def internal_error(exc: BaseException) -> APIError:
    """A 500 for an unexpected exception (its class and text are shown; the traceback is logged)."""
    return APIError(500, f"The server had an error while processing your request: {type(exc).__name__}: {exc}",
                    type="server_error", code="internal_error")
