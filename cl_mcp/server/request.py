"""One JSON-RPC request as the server serves it, and the check of its params
against their schema; shared by the server and the task wiring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cl_mcp.errors import INVALID_PARAMS, JsonRpcError
from cl_mcp.server.intake import QueuedCall
from cl_mcp.wire.contracts import error_location, first_error, params_schema
from cl_mcp.wire.jsonrpc import params_meta

# A 2026-07-28 request's client capabilities, in its params' _meta.
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"


@dataclass(slots=True)
class Request:
    """One request, with the protocol revision it is served under."""

    id: Any
    method: str
    params: Any
    version: str
    modern: bool
    queued: QueuedCall | None = None  # a tools/call's place in the intake queue
    beside: bool = False  # counted among the calls waiting beside the session (intake.py)

    @property
    def meta(self) -> dict[str, Any]:
        return params_meta(self.params)

    @property
    def progress_token(self) -> str | int | None:
        token = self.meta.get("progressToken")
        return token if isinstance(token, (str, int)) and not isinstance(token, bool) else None


def check_params(schema: str, params: Any) -> dict[str, Any]:
    """PARAMS (None counts as {}) when they match SCHEMA, else -32602 saying where not."""
    params = {} if params is None else params
    try:
        violation = first_error(params_schema(schema), params)
    except RecursionError:
        raise JsonRpcError(INVALID_PARAMS, "Invalid params: nested too deeply to validate") from None
    if violation is not None:
        raise JsonRpcError(INVALID_PARAMS, "Invalid params", error_location(violation, "params"))
    return params
