"""The truth harness's driver: `make truth` (python -m tests.truth.run).

For each library of the corpus: a fresh cl-mcp (embedded) loads a copy of
it; every definition's place is checked against the places oracle; then
rounds of seeded random edits, each followed by a compile-form now and
then, and the places of the edited files checked again; at the end every
place once more.  The table goes to docs/truth.md."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth import edits
from tests.truth.backtraces import ANSWERS as BACKTRACES
from tests.truth.corpus import CORPUS, Library, copy_library, load_copy
from tests.truth.frames import ANSWER as FRAMES
from tests.truth.mutants import MUTANTS, Mutant, caused, check_of, run_mutant
from tests.truth.notes import check_notes, read_notes
from tests.truth.places import Compiled, Definition, Layout, Tally, check_places, read_oracle, unique
from tests.truth.places_of_tests import ANSWER as TEST_PLACES
from tests.truth.places_of_tests import check_test_places
from tests.truth.tests_oracle import check_library_tests
from tests.truth.threads import check_library_threads
from tests.truth.xref import CALLEES, Recompiled, check_xref

TABLE = Path(__file__).parents[2] / "docs" / "truth.md"
# Answers that are not about definitions: no rows in the table by definition type.
RUNNING = {"test results", TEST_PLACES, "output", FRAMES, *BACKTRACES}
COMPILABLE = {"function", "macro", "generic-function", "method", "variable"}


def compile_form(process: McpProcess, d: Definition, now: dict[tuple[str, ...], Definition],
                 lines: dict[tuple[str, ...], Compiled], recompiled: set[tuple[str, ...]]) -> str | None:
    """compile-form of D's top-level form; the definitions it holds are
    then compiled at their lines now (and RECOMPILED)."""
    result = process.call("compile-form", path=d.file, line=d.line)
    if result["isError"]:
        return None
    for other in now.values():
        if other.file == d.file and other.end == d.end and other.key in lines:
            lines[other.key] = Compiled(other.line, other.digest)
            recompiled.add(other.key)
    return f"compile-form {d.name} ({Path(d.file).name}:{d.line})"


def compiled_now(fresh: dict[tuple[str, ...], Definition], file: str, start: int, end: int,
                 lines: dict[tuple[str, ...], Compiled], recompiled: set[tuple[str, ...]]) -> None:
    """edit-form compiled what it wrote in FILE, lines START to END: the
    definitions FRESH (the oracle's, just after) reads there are compiled
    at their lines now (and RECOMPILED)."""
    for d in fresh.values():
        if d.file == file and start <= d.line <= end and d.key in lines:
            lines[d.key] = Compiled(d.line, d.digest)
            recompiled.add(d.key)


def check_library(library: Library, rounds: int, seed: int, log=print,
                  env: dict[str, str] | None = None, from_fasls: bool = False) -> Tally:
    """The places of LIBRARY, before and after ROUNDS rounds of edits
    seeded with SEED; ENV, the environment cl-mcp runs in beside ours (a
    planted fault's copy of it: tests/truth/mutants.py); FROM_FASLS, with
    LIBRARY loaded from fasls a plain SBCL compiled (`load_copy`)."""
    tally = Tally()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-") as scratch:
        pristine = copy_library(library, Path(scratch) / "pristine")
        edited = copy_library(library, Path(scratch) / "edited")
        # Whole answers: what the result budget leaves out is tested elsewhere.
        process = McpProcess("--max-result-chars", "1000000", env=env)
        try:
            process.initialize()
            load_copy(process, library, edited, from_fasls)
            definitions, forms = read_oracle(pristine, library.system, edited)
            compiled = unique(definitions)
            known = {d.key for d in definitions}
            layout = Layout()
            layout.update(definitions, forms)
            lines = {key: Compiled(d.line, d.digest) for key, d in compiled.items()}
            now = dict(compiled)
            callees = [d for d in compiled.values() if d.type in CALLEES and not d.name.startswith("(")]
            recompiled: set[tuple[str, ...]] = set()  # the definitions compiled again
            text_unknown: set[str] = set()  # files edited since loaded from their fasls
            sources = sorted({form.file for form in forms})
            # Loaded from fasls, the files are first asked about once edited,
            # as in the trial: an answer before edits would keep their text.
            if not from_fasls:
                check_places(process, tally, "before edits", compiled, lines, now, edited, known, layout)
                check_xref(process, tally, "before edits", callees, edited, pristine, library.system,
                           Recompiled.of(recompiled, compiled, forms, now, forms))
                check_notes(process, tally, "before edits", read_notes(pristine, library.system, edited), forms,
                            sources)
            for _ in range(rounds):
                files = sorted({d.file for d in now.values()})
                touched = rng.sample(files, min(len(files), rng.randint(1, 3)))
                for file in touched:
                    choices = [d for d in now.values() if d.file == file]
                    done = edits.random_edit(rng, rng.choice(choices))
                    if done:
                        log(f"  {done}")
                if from_fasls:  # each file is first asked about once edited
                    text_unknown.update(touched)
                    for key, d in compiled.items():
                        if d.file in touched and key not in recompiled:
                            lines[key] = replace(lines[key], text_known=False)
                fresh, fresh_forms = read_oracle(pristine, library.system, edited, touched)
                file = rng.choice(touched)
                in_file = [d for d in fresh if d.file == file]
                if in_file and rng.random() < 0.5:  # an assistant's edit too, through cl-mcp
                    done = edits.assistant_edit(rng, process, rng.choice(in_file))
                    if done:
                        log(f"  {done[0]}")
                        fresh, fresh_forms = read_oracle(pristine, library.system, edited, touched)
                        if done[1]:
                            compiled_now(unique(fresh), file, *done[1], lines, recompiled)
                layout.update(fresh, fresh_forms, touched)
                now = {k: d for k, d in now.items() if d.file not in touched} | unique(fresh)
                compilable = [d for d in fresh if d.type in COMPILABLE and d.key in lines]
                if compilable and rng.random() < 0.5:
                    chosen = rng.choice(compilable)
                    done = compile_form(process, chosen, now, lines, recompiled)
                    if done:
                        log(f"  {done}")
                in_touched = {k: d for k, d in compiled.items() if d.file in touched}
                check_places(process, tally, "after edits", in_touched, lines, now, edited, known, layout)
            if rounds:
                check_places(process, tally, "after edits", compiled, lines, now, edited, known, layout)
                forms_now = read_oracle(pristine, library.system, edited)[1]
                check_xref(process, tally, "after edits", callees, edited, pristine, library.system,
                           Recompiled.of(recompiled, compiled, forms, now, forms_now), text_unknown)
                check_notes(process, tally, "after edits", read_notes(pristine, library.system, edited), forms_now,
                            sources)
        finally:
            process.close(60)
    return tally


MUTANT_ROUNDS = 3


def planted_faults(seed: int, pool: Executor, log=print) -> list[tuple[Mutant, int]]:
    """Each mutant's count of wrong answers that a run without it (the same
    library, rounds and seed) does not have; the runs in POOL."""
    baselines: dict[tuple[str, str], Future[Tally]] = {}
    for mutant in MUTANTS:
        if (mutant.library, mutant.check) not in baselines:
            baselines[mutant.library, mutant.check] = pool.submit(check_of, mutant, MUTANT_ROUNDS, seed, check_library)
    planted = [pool.submit(run_mutant, mutant, MUTANT_ROUNDS, seed, check_library) for mutant in MUTANTS]
    counts = []
    for mutant, tally in zip(MUTANTS, planted):
        count = caused(tally.result(), baselines[mutant.library, mutant.check].result())
        log(f"  mutant: {mutant.name}: {count} wrong answers")
        counts.append((mutant, count))
    return counts


FROM_FASLS = "(files loaded from fasls)"


def every_check(library: Library, rounds: int, seed: int, output_rounds: int, fasl_rounds: int) -> Tally:
    """LIBRARY's places, xref and notes (ROUNDS rounds of edits seeded with
    SEED; then FASL_ROUNDS rounds with the library loaded from fasls a plain
    SBCL compiled), test results and places, backtraces and OUTPUT_ROUNDS
    rounds of output, in one tally; its log on stderr, each line marked
    with it."""
    def log(text: str) -> None:
        print(f"{library.directory}: {text.strip()}", file=sys.stderr, flush=True)
    tally = check_library(library, rounds, seed, log=log)
    if fasl_rounds:
        tally.add(check_library(library, fasl_rounds, seed, log=log, from_fasls=True), FROM_FASLS)
    check_library_tests(library, tally)
    if not library.untested:
        check_test_places(library, tally, log=log)
    check_library_threads(library, tally, output_rounds, seed, log=log)
    log(f"{sum(tally.right.values())} right, {sum(tally.wrong.values())} wrong")
    return tally


def mutant_table(counts: list[tuple[Mutant, int]]) -> list[str]:
    """docs/truth.md's table of planted faults."""
    out = ["## Planted faults", "",
           "Each comparison above is proved by a fault planted in a scratch copy of cl-mcp",
           "(tests/truth/mutants.py), one at a time: the library's check (its places, xref and",
           f"notes, {MUTANT_ROUNDS} rounds of edits; or its backtraces and output; or its test results and places) must count wrong answers that the same run without",
           "the fault does not. A fault that causes none fails `make truth`; three of them run in",
           "`make test` (tests/integration/test_truth.py).", "",
           "| planted fault | where | library | wrong answers it caused |", "|---|---|---|---|"]
    out += [f"| {m.name} | {m.file} | {m.library} | {count} |" for m, count in counts]
    return out + [""]


def table(results: dict[str, Tally], seconds: float, rounds: int, seed: int, output_rounds: int,
          fasl_rounds: int, counts: list[tuple[Mutant, int]], jobs: int) -> str:
    """docs/truth.md: per library and per answer, then per definition type."""
    answers = sorted({a for t in results.values() for a, _ in [*t.right, *t.wrong]})
    out = ["# Truth on real code",
           "",
           "Written by `make truth` (tests/truth/run.py; issue 37): every definition of each",
           "library read by a plain SBCL (tests/truth/places.lisp), its place asked of cl-mcp",
           f"(embedded) and compared, before and after {rounds} rounds of seeded edits",
           f"(seed {seed}). {seconds:.0f} s, {jobs} libraries or mutants checked at a time (`--jobs`).",
           "",
           "The harness lives in tests/truth/, beside the integration tests whose cl-mcp",
           "driver (McpProcess) it uses; pytest collects none of it, but its subsets, in",
           "tests/integration/test_truth*.py. A definition is right when its place's line is the oracle's line and",
           "its `place` and `compiledLine` are as docs/tools.md says (Places after edits):",
           "`not-found` when it is not in the file any more; `found-after-edit` with the line",
           "it was compiled at when it starts on another line; `unchanged` when it starts on",
           "the line it was compiled at (with its text edited inside, `found-after-edit` with",
           "that same line is right too). A name defined twice in a library is not checked.",
           "",
           "Then the same library is loaded again, in a fresh cl-mcp, from fasls a plain SBCL",
           "compiled (an evaluation's `asdf:load-system`, as code loaded without cl-mcp: Swank",
           f"keeps no text of the files as compiled), and edited for {fasl_rounds} rounds (seed {seed}),",
           f"each file asked about only once edited: the rows `{FROM_FASLS}`. There a",
           "definition is right `found-after-edit` at its line now with no `compiledLine`, or",
           "`not-found` when it is gone (docs/tools.md, Places after edits).",
           "",
           "Both ways: a definition find-definition lists twice is wrong (`duplicate`), and so is",
           "one it lists in the library's files, of a kind the oracle reads, that the oracle does",
           "not read there (`extra`; unless its line is in a form that defines more than the oracle",
           "names: a class's accessors, a generic function's `:method`s, a library's own defining",
           "macro); describe-symbol without a location, where the library defines the symbol's",
           "function, macro, variable, class or type, is `missing`.",
           "",
           "xref's callers of every function and generic function, before the edits and after",
           "all of them, are checked both ways against the calls SBCL records (tests/truth/xref.py,",
           "callers.lisp): a plain SBCL that loaded the pristine library answers",
           "`sb-introspect:who-calls`, and places each call by reading the texts: its top-level",
           "form and the compiler's number of its form inside it, found again in the file as it is",
           "now (the top-level form that reads the same). Each answer is matched to one recorded",
           "call; its caller's line, its reference line, `place` and `compiledLine` must be the",
           "call's. A recorded call no answer matches is `missing`, an answer that matches none",
           "`extra` (or `duplicate`), a matched one with a field wrong `wrong field`: the kinds",
           "below count them apart. The callers compile-form or edit-form compiled again are left out.",
           "",
           "| library | answer | checked | right | wrong |",
           "|---|---|---|---|---|"]
    for name, tally in results.items():
        for answer in answers:
            right = sum(n for (a, _), n in tally.right.items() if a == answer)
            wrong = sum(n for (a, _), n in tally.wrong.items() if a == answer)
            if right or wrong:
                out.append(f"| {name} | {answer} | {right + wrong} | {right} | {wrong} |")
    kinds = sorted({k for t in results.values() for a, k in [*t.right, *t.wrong]
                    if a not in RUNNING and not a.startswith("compiler notes")})
    out += ["", "| definition type | answer | checked | right | wrong |", "|---|---|---|---|---|"]
    for kind in kinds:
        for answer in answers:
            right = sum(t.right.get((answer, kind), 0) for t in results.values())
            wrong = sum(t.wrong.get((answer, kind), 0) for t in results.values())
            if right or wrong:
                out.append(f"| {kind} | {answer} | {right + wrong} | {right} | {wrong} |")
    out += ["", "Test results (tests/truth/tests_oracle.py): each library's tests run in a plain",
            "`sbcl --non-interactive` (`asdf:test-system`) and through run-tests, in a fresh",
            "cl-mcp; each total and each test the framework prints as failed (expected to fail",
            "or not) must be run-tests' too. A library whose runner is its own (no FiveAM or RT",
            "summary printed) is right when run-tests recognises no framework either. Its",
            "subset in `make test`: tests/integration/test_truth_tests.py. Not checked:",
            *(f"{lib.directory}'s tests: {lib.untested}." for lib in CORPUS if lib.untested),
            "", "Compiler notes (tests/truth/notes.py): a plain SBCL that loaded the library",
            "compiles each of its files again (tests/truth/notes.lisp) and prints each condition",
            "the compiler signals with a place: severity, message, and the top-level form it was",
            "compiling. compile-file (`notes: \"all\"`, not loaded) of each file, before the edits",
            "and after them, must list each of them (unless its answer says it left some out) and",
            "no other, each at a line inside that top-level form, `unchanged`. Checked by severity.",
            "Its subset in `make test`: tests/integration/test_truth_notes.py.",
            "",
            "Backtraces (tests/truth/backtraces.py, backtraces.lisp): in a fresh cl-mcp, each",
            "exported function of the library (compiled from its files; macros aside) is called",
            "in a thread an evaluation starts, with NIL for each required argument (and, when",
            "that returns, `:truth-wrong-type`), under the thread's outermost handler, which takes",
            "`sb-debug:list-backtrace` at the signal and declines. A call is checked when that",
            "handler saw an error and the thread stopped at it: the oracle's frames, from the one",
            "that signalled (below `%SIGNAL`, or below `INTERNAL-ERROR` for a trap in compiled",
            "code) down to the thread's outermost own frame, SBCL's evaluator and foreign frames",
            "aside, must all appear in order in backtrace's answer for the evaluation number the",
            "thread waits under, and in the threads tool's backtrace of the thread, with no other",
            "frame between the first and the last of them (an extra frame is wrong). The same call",
            "is then made in an evaluation's own thread: when it signals there too, the first 20",
            "frames of that oracle (an error result shows 20; the `(LAMBDA ())` SBCL's evaluator",
            "wraps a form in aside, as docs/tools.md says) must be in the result's `[Backtrace]`",
            "(evaluate-lisp error). A frame",
            "appears when its printed call is the oracle's function name, printed in CL-USER with",
            "`*print-length*` 10 and `*print-level*` 3 as docs/tools.md prints a frame, in",
            "parentheses alone or followed by a space. Its subset in `make test`:",
            "tests/integration/test_truth_backtraces.py.",
            "",
            "Output (tests/truth/output.py, output.lisp): writers write seeded random lines",
            "(non-ASCII included, each begun with the writer's tag) one `write-string` a line, or",
            "`format`'s `~A~%`, or one `write-char` a character, and count what they wrote; the",
            "oracle is each writer's count of characters and lines and the MD5 of its text.",
            "cl-mcp's answer is all the model can see of the scenario's calls: each evaluation's",
            "own output and the threads' output each `[threads]` notice names, read whole with",
            "read-output, each line's `[THREAD] ` mark taken off (a `[THREAD]+` line joined to that",
            "thread's line before, as docs/tools.md says). A writer is right when its lines there",
            "are its text exactly. The scenarios run the corpus's own threads:",
            "bordeaux-threads' (writing to the global streams or to a kept evaluation's stream,",
            "after that evaluation ended; several at once, joined by their evaluation; writing",
            "then stopping at an error) and lparallel's kernel workers (tasks of an evaluation",
            "after the one that made the kernel, whose streams it bound; futures that end after",
            f"their evaluation; a kernel made and used by one evaluation), {output_rounds} seeded rounds",
            "of each. Its subset in `make test`: tests/integration/test_truth_output.py. Its first",
            "runs found two faults, fixed since (875abbe, db57814): a thread's line was cut where a",
            "reply took the news or another thread wrote, its rest a line of its own (lparallel's",
            "workers, all named after their kernel, could not be told apart); and threads writing",
            "at once to a running evaluation's stream lost characters (up to half of a PMAP's).",
            "",
            "Frame places (tests/truth/frames.py): each frame of the library's files in",
            "backtrace's answer for those calls must be at a line inside a definition, in its file,",
            "of the function the frame runs (its printed call's name; a method's, or the `:IN`",
            "function of a local function or lambda), from the definition's first line to the last",
            "line of its top-level form, as places.lisp reads them, `unchanged`; a frame of a",
            "function the file does not define by name (a library macro's) inside one of the",
            "file's top-level forms. Its first run found frames whose code has debug blocks placed",
            "one character early (Swank counts their position from 0, its definitions' from 1):",
            "a form opening right after another parenthesis read as moved by an edit.",
            "",
            "Test places (tests/truth/places_of_tests.py): in a fresh copy, every test defined",
            "at the top level of the library's files (FiveAM's `test` and `def-test`,",
            "split-sequence's `define-test`, RT's `deftest`) is made to fail without moving a line",
            "(a failing check, or one more value RT must see, written before its closing",
            "parenthesis); run-tests of the system must place each failure it reports at the line",
            "where its test's form starts. Tests it does not report (past its 200 problems, or in",
            "suites the test-op does not run), and RT tests of circular lists (RT would print",
            "their failing values without end, in a plain SBCL too), are not checked. Its first",
            "run found esrap's test TRACE-RULE.REDEFINITION placed at the rule of the same name",
            "above it, and named-readtables' tests (its own copy of RT) not placed at all.",
            "",
            "Not checked yet by the harness: frames' locals.",
            "", *mutant_table(counts), "## Wrong answers", ""]
    for name, tally in results.items():
        for failure in tally.failures[:40]:
            out.append(f"- {name}: {failure}")
        if len(tally.failures) > 40:
            out.append(f"- {name}: … and {len(tally.failures) - 40} more")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("libraries", nargs="*", help="directories of the corpus to check (default: all)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--output-rounds", type=int, default=6, help="rounds of the output scenarios")
    parser.add_argument("--fasl-rounds", type=int, default=4,
                        help="rounds of edits to the library loaded from fasls (0: none)")
    parser.add_argument("--output", type=Path, default=TABLE)
    parser.add_argument("--no-mutants", action="store_true", help="leave out the planted faults")
    parser.add_argument("--jobs", type=int, default=2,
                        help="libraries and mutants checked at once, each in a cl-mcp and images of its own")
    options = parser.parse_args()
    chosen = [lib for lib in CORPUS if not options.libraries or lib.directory in options.libraries]
    started = time.monotonic()
    with ProcessPoolExecutor(options.jobs) as pool:
        checks = {library.directory: pool.submit(every_check, library, options.rounds, options.seed,
                                                 options.output_rounds, options.fasl_rounds)
                  for library in chosen}
        counts = [] if options.no_mutants else planted_faults(options.seed, pool,
                                                             log=lambda text: print(text, file=sys.stderr))
        results = {name: check.result() for name, check in checks.items()}
    options.output.write_text(table(results, time.monotonic() - started, options.rounds, options.seed,
                                    options.output_rounds, options.fasl_rounds, counts, options.jobs))
    unseen = [mutant.name for mutant, count in counts if count == 0]
    if unseen:
        sys.exit(f"planted faults no comparison saw: {', '.join(unseen)}")


if __name__ == "__main__":
    main()
