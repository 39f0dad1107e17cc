"""The answer-window rule, stated once: work still running after its answer
window answers "still running" and goes on in the background, when the
window closes before the work's own deadline; the window is the call's
`answer-within`, else the server's --answer-within.  The agent's own
statement of it is `window-first` (agent/registries.lisp)."""

from __future__ import annotations

from cl_mcp.tools.calls import lisp_seconds
from cl_mcp.wire.sexp import Keyword, SExp


def answer_window(requested: float | None, default: float, deadline: float | None) -> float | None:
    """The seconds after which work answers "still running": REQUESTED (the
    call's answer-within), else DEFAULT (--answer-within), when that is
    shorter than DEADLINE (None: the work has none); else None, and the
    caller waits for the outcome."""
    window = requested or default
    return window if deadline is None or window < deadline else None


def window_keywords(window: float | None) -> list[SExp]:
    """An agent call's `:answer-within` for WINDOW (`answer_window`'s
    answer), or nothing: the agent's default is to wait for the outcome."""
    return [] if window is None else [_ANSWER_WITHIN, lisp_seconds(window)]


_ANSWER_WITHIN = Keyword("answer-within")
