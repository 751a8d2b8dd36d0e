"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.

Every failure a client can cause maps to a 4xx here; the catch-all 500 exists only for bugs in
the server itself and never shows a stack trace.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("pagoda.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
        location: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.location = location


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(error: APIError) -> JSONResponse:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    if error.location is not None:
        headers["Location"] = error.location
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code),
        status_code=error.status,
        headers=headers or None,
    )


def validation_message(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """A 400's message and the field it names, from the first of the errors."""
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "invalid JSON")
        return f"The request body is not valid JSON ({detail}); send a JSON object.", None
    if (param := first.get("ctx", {}).get("param")) is not None:
        return f"Invalid value for '{param}': {first.get('msg')}.", param
    if not loc:
        return f"The request body is invalid: {first.get('msg')}; send a JSON object.", None
    # Union members add their type names to the location (prompt.list[int].0); keep what a user wrote.
    param = ".".join(part for part in loc if not any(c in part for c in "[]") and part not in {"str", "int"})
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"Invalid value for '{param}': {message}.", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error while serving %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body(500, "The server hit an internal error; retry, and report it if it persists."),
            status_code=500,
        )
