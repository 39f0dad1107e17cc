"""cl-mcp's own log records, forwarded to the MCP client as
notifications/message (image restarts, lost connections, truncated output)."""

from __future__ import annotations

import logging
from typing import Protocol

LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning",
               logging.ERROR: "error", logging.CRITICAL: "critical"}


class ClientLogger(Protocol):
    def log_to_client(self, level: str, logger: str, data: object) -> None: ...


class ClientLogHandler(logging.Handler):
    """Hands each record to the server, which sends what the client's level
    admits.  Everything also goes to stderr through the root handler."""

    def __init__(self, server: ClientLogger) -> None:
        super().__init__(logging.DEBUG)
        self._server = server
        self._emitting = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._emitting:  # a record logged while sending one
            return
        self._emitting = True
        try:
            level = LEVEL_NAMES.get(record.levelno, "info")
            self._server.log_to_client(level, record.name, record.getMessage())
        except Exception:
            self.handleError(record)
        finally:
            self._emitting = False
