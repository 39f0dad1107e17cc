"""The baseline for start-up: the least a Python MCP server on asyncio can do
before it answers `initialize`.  Standard library only; it reads stdin in an
asyncio loop, answers `initialize` and `ping` with fixed results, and exits
at the end of its input.  bench/run.py starts it with cl-mcp's interpreter."""

import asyncio
import json
import sys

RESULTS = {
    "initialize": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                   "serverInfo": {"name": "bench-stub", "version": "0"}},
    "ping": {},
}


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        message = json.loads(line)
        if "id" in message:
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": RESULTS.get(message["method"], {})}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(serve())
