"""The output oracle: every character a thread writes reaches the model.

Writers (output.lisp) write seeded random lines, non-ASCII included, each
begun with the writer's tag, and count what they wrote; the oracle is that
count of characters and lines and the MD5 of the text.  cl-mcp's answer is
everything the model can see of the calls the scenario made: each
evaluation's own output and the threads' output each [threads] notice
names, read whole through read-output (each line's `[THREAD] ` mark taken
off, and a line marked `[THREAD]+ ` joined to that thread's line before,
as docs/tools.md says).  A writer is right when its lines there, in its
order, are its text exactly.

The scenarios drive the corpus's threads: bordeaux-threads' threads that
write to the global streams or keep an evaluation's stream, while it runs
or after it ended, or that write and then stop at an error; lparallel's
kernel workers, whose kernel binds the streams of the evaluation that made
it, running tasks in later evaluations and futures that end after theirs.
Each round draws the sizes, the ways of writing and the streams from the
seed; writers that share a running evaluation's stream write each line
with one WRITE-STRING (`Writers.make`).  Lines stay under 200 characters
(read-output cuts a line longer than a quarter of the result budget) and
a round writes well under the 1,000,000 characters a stream gathers
between two calls (docs/tools.md).
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests.integration.conftest import McpProcess
from tests.truth.places import Tally

LISP = Path(__file__).with_name("output.lisp")
NEWS = re.compile(r'read-output \{"evaluation": (\d+)\}')
NOTICE = re.compile(r"\n\n\[threads\]\n(.*)\Z", re.S)
# A line of the threads' output: its thread's mark, + when it continues
# that thread's line before (docs/tools.md), and its text.
MARKED = re.compile(r"^\[([^\]\n]*)\](\+?)(?: |$)(.*)$")
TAG = re.compile(r"^(w\d+[oe]) \d+ ")
STYLES = (":whole", ":format", ":chars")


@dataclass
class Seen:
    """The calls of one scenario, their results kept: what the model saw."""

    process: McpProcess
    results: list[dict[str, Any]] = field(default_factory=list)

    def eval(self, code: str) -> dict[str, Any]:
        """CODE's result, and, when it went on in the background (a loaded
        machine outlasts the answer window), its outcome, as a model awaits it."""
        result = self.process.call("evaluate-lisp", code=code, wait=120)
        self.results.append(result)
        if result.get("structuredContent", {}).get("running"):
            result = self.process.call("await-evaluation", evaluation=result["structuredContent"]["number"],
                                       wait=120)
            self.results.append(result)
        assert not result["isError"], result["content"][0]["text"][:2000]
        return result

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.process.call(tool, **arguments)
        self.results.append(result)
        return result

    def until(self, code: str, seconds: float = 60) -> None:
        """Evaluate CODE until its value is true, then once more `t`: the
        news of the last writes may come after the answer that saw them end."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.eval(code)["structuredContent"]["values"][:1] != ["NIL"]:
                self.eval("t")
                return
            time.sleep(0.01)
        raise AssertionError(f"{code} stayed false for {seconds} s")


def read_whole(process: McpProcess, number: int, stream: str) -> list[str]:
    """Every line of evaluation NUMBER's STREAM that read-output gives;
    none when it kept no output there."""
    lines: list[str] = []
    while True:
        result = process.call("read-output", evaluation=number, stream=stream, offset=len(lines) + 1)
        if result["isError"]:
            return lines
        shown = result["structuredContent"]["lines"]
        lines += [line.split(": ", 1)[1] if ": " in line else "" for line in shown]
        if not shown or len(lines) >= result["structuredContent"]["totalLines"]:
            return lines


def visible(seen: Seen) -> dict[str, list[str]]:
    """Each writer's lines the model can see, by tag, in the order seen."""
    reads: list[tuple[int, str]] = []
    for result in seen.results:
        structure = result.get("structuredContent") or {}
        number = structure.get("number")
        for stream in ("stdout", "stderr"):
            if number and structure.get(stream):
                reads.append((number, stream))
        notice = NOTICE.search(result["content"][0]["text"])
        for news in NEWS.findall(notice.group(1) if notice else ""):
            reads += [(int(news), "stdout"), (int(news), "stderr")]
    lines: list[str] = []
    last: dict[tuple[str, str], int] = {}  # each thread's last line on each stream
    for number, stream in dict.fromkeys(reads):
        for line in read_whole(seen.process, number, stream):
            marked = MARKED.match(line)
            if marked and marked.group(2) and (marked.group(1), stream) in last:
                lines[last[(marked.group(1), stream)]] += marked.group(3)
                continue
            if marked:
                last[(marked.group(1), stream)] = len(lines)
            lines.append(marked.group(3) if marked else line)
    by_tag: dict[str, list[str]] = {}
    for line in lines:
        tag = TAG.match(line)
        if tag:
            by_tag.setdefault(tag.group(1), []).append(line)
    return by_tag


def compare(seen: Seen, tally: Tally, answer: str, tags: list[str]) -> None:
    """Count each writer of TAGS right when the lines the model saw are
    the text it wrote: its count of characters and lines, and its MD5."""
    result = seen.process.call("evaluate-lisp", code=f"(truth-output:written {' '.join(map(quote, tags))})")
    written = {}
    for line in result["structuredContent"]["stdout"].splitlines():
        tag, characters, lines, digest = line.split("\t")
        written[tag] = (int(characters), int(lines), digest)
    by_tag = visible(seen)
    for tag in tags:
        text = "".join(line + "\n" for line in by_tag.get(tag, []))
        got = (len(text), text.count("\n"), hashlib.md5(text.encode()).hexdigest())
        tally.count(answer, "writer", None if got == written[tag] else
                    f"writer {tag}: wrote {written[tag][0]} characters in {written[tag][1]} lines,"
                    f" the model saw {got[0]} in {got[1]}" + ("" if got[0] != written[tag][0] else " (other text)"))


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Writers:
    """Fresh writers' tags and the Lisp forms that make them, drawn from RNG."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.number = 0

    def make(self, stream: str, shared: bool) -> tuple[str, str]:
        """A tag and the form of a writer for STREAM (o or e); SHARED when
        other threads write to the same stream of a running evaluation:
        there a line written in pieces mixes with theirs, as on any stream
        threads share, so it writes each line whole."""
        self.number += 1
        tag = f"w{self.number}{stream}"
        lines = self.rng.choice([1, 3, 40, self.rng.randint(1, 1500)])
        style = ":whole" if shared else self.rng.choice(STYLES)
        return tag, (f'(truth-output:writer "{tag}" {lines} {self.rng.randint(0, 150)} '
                     f'{self.rng.randint(0, 2**31)} :style {style})')


def writes(writers: Writers, streams: str, shared: bool = False) -> tuple[list[str], str]:
    """Tags, and a form that writes each of STREAMS (o: OUT, e: ERR, the
    variables the form runs with) with a writer of its own, SHARED or not
    (`Writers.make`)."""
    tags, forms = [], []
    for stream in streams:
        tag, writer = writers.make(stream, shared)
        tags.append(tag)
        forms.append(f"(funcall {writer} {'out' if stream == 'o' else 'err'})")
    return tags, f"(progn {' '.join(forms)})"


def bt_global_after(seen: Seen, writers: Writers) -> list[str]:
    """A bordeaux-threads thread writes to the global streams once the
    evaluation that made it has ended."""
    tags, body = writes(writers, writers.rng.choice(["o", "e", "oe"]))
    seen.eval(f"""(defparameter truth-output::*go* (bt:make-semaphore))
(bt:make-thread (lambda () (bt:wait-on-semaphore truth-output::*go*)
                  (let ((out *standard-output*) (err *error-output*)) {body}))
                :name "truth-bt-global")""")
    seen.until(f"(bt:signal-semaphore truth-output::*go*) (truth-output:done-p {' '.join(map(quote, tags))})")
    return tags


def bt_kept_after(seen: Seen, writers: Writers) -> list[str]:
    """A bordeaux-threads thread keeps its evaluation's streams and writes
    to them after that evaluation ended."""
    tags, body = writes(writers, writers.rng.choice(["o", "e", "oe"]))
    seen.eval(f"""(defparameter truth-output::*go* (bt:make-semaphore))
(let ((out *standard-output*) (err *error-output*))
  (bt:make-thread (lambda () (bt:wait-on-semaphore truth-output::*go*) {body}) :name "truth-bt-kept"))""")
    seen.until(f"(bt:signal-semaphore truth-output::*go*) (truth-output:done-p {' '.join(map(quote, tags))})")
    return tags


def bt_joined(seen: Seen, writers: Writers) -> list[str]:
    """Several bordeaux-threads threads write at once, to the evaluation's
    streams or the global ones, and the evaluation joins them."""
    tags, threads = [], []
    streams = "(out *standard-output*) (err *error-output*)"
    for number in range(writers.rng.randint(2, 4)):
        kept = writers.rng.random() < 0.5  # the evaluation's streams, bound before the thread starts
        more, body = writes(writers, writers.rng.choice(["o", "e", "oe"]), shared=kept)
        tags += more
        function = f"(let ({streams}) (lambda () {body}))" if kept else f"(lambda () (let ({streams}) {body}))"
        threads.append(f'(bt:make-thread {function} :name "truth-bt-{number}")')
    seen.eval(f"(mapc #'bt:join-thread (list {' '.join(threads)}))")
    seen.until(f"(truth-output:done-p {' '.join(map(quote, tags))})")
    return tags


def bt_then_error(seen: Seen, writers: Writers) -> list[str]:
    """A bordeaux-threads thread writes, then stops at an error; it is
    aborted once its output is in."""
    tags, body = writes(writers, writers.rng.choice(["o", "oe"]))
    seen.eval(f"""(bt:make-thread (lambda () (let ((out *standard-output*) (err *error-output*)) {body})
                                (error "truth output then an error"))
                :name "truth-bt-erring")""")
    seen.until(f"(truth-output:done-p {' '.join(map(quote, tags))})")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        threads = seen.call("threads", action="list")["structuredContent"]["threads"]
        entry = next((t for t in threads if t["name"] == "truth-bt-erring"), None)
        if entry and entry.get("state") == "stopped-at-error":
            seen.call("invoke-restart", evaluation=entry["evaluation"], restart="ABORT")
            return tags
        time.sleep(0.01)
    raise AssertionError(f"truth-bt-erring did not stop at its error: {threads}")


def lparallel_tasks_later(seen: Seen, writers: Writers) -> list[str]:
    """lparallel's kernel, made by one evaluation, runs a later
    evaluation's tasks: they write to the streams it bound, the first
    evaluation's, long ended."""
    seen.eval('(setf lparallel:*kernel* (lparallel:make-kernel 3 :name "truth-kernel"))')
    tags, tasks = [], []
    for _ in range(writers.rng.randint(2, 6)):
        more, body = writes(writers, writers.rng.choice(["o", "e", "oe"]))
        tags += more
        tasks.append(f"(lambda () (let ((out *standard-output*) (err *error-output*)) {body}))")
    seen.eval(f"(lparallel:pmap 'list #'funcall (list {' '.join(tasks)}))")
    seen.until(f"(truth-output:done-p {' '.join(map(quote, tags))})")
    seen.eval("(lparallel:end-kernel :wait t)")
    return tags


def lparallel_futures_after(seen: Seen, writers: Writers) -> list[str]:
    """lparallel's futures, made by an evaluation that ends at once, write
    after it ended."""
    seen.eval('(setf lparallel:*kernel* (lparallel:make-kernel 2 :name "truth-kernel"))')
    tags, futures = [], []
    for _ in range(writers.rng.randint(1, 4)):
        more, body = writes(writers, writers.rng.choice(["o", "e", "oe"]))
        tags += more
        futures.append(f"(lparallel:future (sleep 0.3) (let ((out *standard-output*) (err *error-output*)) {body}))")
    seen.eval(f"(progn {' '.join(futures)} t)")
    seen.until(f"(truth-output:done-p {' '.join(map(quote, tags))})")
    seen.eval("(lparallel:end-kernel :wait t)")
    return tags


def lparallel_same_evaluation(seen: Seen, writers: Writers) -> list[str]:
    """lparallel's kernel made and used by one evaluation: its tasks write
    while it runs."""
    tags, tasks = [], []
    for _ in range(writers.rng.randint(2, 6)):
        more, body = writes(writers, writers.rng.choice(["o", "e", "oe"]), shared=True)
        tags += more
        tasks.append(f"(lambda () (let ((out *standard-output*) (err *error-output*)) {body}))")
    seen.eval(f"""(let ((lparallel:*kernel* (lparallel:make-kernel 3 :name "truth-kernel")))
  (unwind-protect (lparallel:pmap 'list #'funcall (list {' '.join(tasks)}))
    (lparallel:end-kernel :wait t)))""")
    seen.until(f"(truth-output:done-p {' '.join(map(quote, tags))})")
    return tags


Scenario = Callable[[Seen, Writers], list[str]]
SCENARIOS: dict[str, dict[str, Scenario]] = {
    "bordeaux-threads": {"thread writing after its evaluation": bt_global_after,
                         "thread writing to an ended evaluation's stream": bt_kept_after,
                         "threads joined by their evaluation": bt_joined,
                         "thread writing then stopping at an error": bt_then_error},
    "lparallel": {"kernel tasks of a later evaluation": lparallel_tasks_later,
                  "futures ending after their evaluation": lparallel_futures_after,
                  "kernel of the evaluation that runs the tasks": lparallel_same_evaluation},
}


def check_output(process: McpProcess, tally: Tally, library: str, rounds: int, seed: int, log=print) -> None:
    """ROUNDS rounds of LIBRARY's scenarios (none for a library whose
    threads are not among them) in PROCESS, which loaded it."""
    scenarios = SCENARIOS.get(library, {})
    if not scenarios:
        return
    seen = Seen(process)
    seen.eval(f'(load "{LISP}")')
    writers = Writers(random.Random(seed))
    for _ in range(rounds):
        for name, scenario in scenarios.items():
            seen = Seen(process)
            tags = scenario(seen, writers)
            compare(seen, tally, "output", tags)
    log(f"  output: {sum(n for (a, _), n in tally.right.items() if a == 'output')} writers right")
