"""The least work a stdio server in a process of its own between the client
and Swank can do: a blocking relay that reads a JSON-RPC line, sends one
fixed evaluate request down an image's lane, waits for the whole reply in a
blocking recv and writes a fixed answer with the request's id.  No
validation, no asyncio, no rendering: what it costs beyond raw Swank is the
third process itself (two more pipe hops, two more processes to wake).

    python bench/relay.py NAME SECRET     (NAME: a lane opened by open-lane)
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cl_mcp.lisp.swank.framing import encode_frame  # noqa: E402

REQUEST = ('(:emacs-rex (cl-mcp-agent:evaluate "(+ 1 2)" :timeout 30 :tag {0}) '
           '"COMMON-LISP-USER" t {0})')
ANSWER = {"content": [{"type": "text", "text": "=> 3"}], "isError": False}


def main() -> None:
    name, secret = sys.argv[1], sys.argv[2]
    lane = socket.socket(socket.AF_UNIX)
    lane.connect("\0" + name)  # an abstract Unix-domain socket
    lane.sendall(encode_frame(secret))
    pending = b""
    for count in itertools.count(1):
        while b"\n" not in pending:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        result = {}  # initialize, ping
        if message.get("method") == "tools/call":
            lane.sendall(encode_frame(REQUEST.format(count)))
            reply = b""
            while len(reply) < 6 or len(reply) < 6 + int(reply[:6], 16):
                reply += lane.recv(1 << 16)
            if not reply[6:].startswith(b"(:return (:ok"):
                sys.exit(f"relay: the image did not answer :ok: {reply[:200]!r}")
            result = ANSWER
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        os.write(1, json.dumps(answer).encode() + b"\n")


if __name__ == "__main__":
    main()
