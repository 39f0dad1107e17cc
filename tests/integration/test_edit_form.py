"""edit-form and read-lisp-file on real code: Debian's split-sequence,
cl-ppcre and iterate, copied to a temporary directory.  Seeded random edits,
one per top-level form: every byte outside the edit is compared, the file
reads to the same forms but the edited one, the system still loads and
find-definition gives each edited definition's current line.  Broken texts
are refused with the file unchanged; a named-readtables file is edited and
compiled in its readtable.  In an image cl-mcp owns and in a programmer's
image it attaches to."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.integration.devtools import (MODES, checked_call, cl_mcp_in, loaded_copy,
                                        shared_with_emacs)

DEBIAN = Path("/usr/share/common-lisp/source")


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


def outline(process, path: Path) -> list[dict]:
    result = checked_call(process, "read-lisp-file", path=str(path))
    assert not result["isError"], result
    return result["structuredContent"]["forms"]


def edit(process, path: Path, **arguments) -> dict:
    return checked_call(process, "edit-form", path=str(path), **arguments)


def form_bytes(path: Path, form: dict) -> tuple[int, int]:
    """The byte offsets of FORM (an outline entry with its text) in PATH."""
    data = path.read_bytes()
    line_start = sum(len(line) for line in data.splitlines(keepends=True)[:form["line"] - 1])
    start = data.index(form["text"].encode(), line_start)
    return start, start + len(form["text"].encode())


def form_text(process, path: Path, line: int) -> dict:
    result = checked_call(process, "read-lisp-file", path=str(path), mode="form", line=line)
    assert not result["isError"], result
    return result["structuredContent"]["forms"][0]


def reformatted(text: str) -> str:
    """TEXT with the blank after its operator made a line break: the same forms."""
    return re.sub(r"^\((\S+) ", r"(\1\n    ", text, count=1)


def changed_body(text: str) -> str | None:
    """A defun's TEXT with a declaration after its lambda list (a changed
    body that loads the same), or None for any other form."""
    match = re.match(r"\(defun \S+ \(", text)
    if not match:
        return None
    depth, index = 0, match.end() - 1
    for index in range(match.end() - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            break
    return text[:index + 1] + "\n  (declare (optimize (debug 2)))" + text[index + 1:]


def qualified(name: str, package: str) -> str:
    return name if ":" in name else f"{package}::{name}"


def definition_line(process, symbol: str) -> dict:
    result = checked_call(process, "find-definition", symbol=symbol)
    found = [d for d in result["structuredContent"]["definitions"] if d["type"] == "function"]
    assert len(found) == 1, result
    return found[0]


def random_edits(process, path: Path, rng: random.Random) -> None:
    """One edit per top-level form of PATH, each checked byte for byte."""
    forms = outline(process, path)
    for index in range(len(forms)):
        before = outline(process, path)
        entry = form_text(process, path, before[index]["line"])
        start, end = form_bytes(path, entry)
        original = path.read_bytes()
        action = rng.choice(["reformat", "body", "insert", "insert-delete"])
        new = changed_body(entry["text"]) if action == "body" else None
        if action == "reformat" or (action == "body" and new is None):
            new, action = reformatted(entry["text"]), "reformat"
        if action in ("reformat", "body"):
            result = edit(process, path, line=entry["line"], text=new)
            expected = original[:start] + new.encode() + original[end:]
        else:
            new = f"(defun cl-mcp-inserted-{index} () {index})"
            where = rng.choice(["insert-before", "insert-after"])
            result = edit(process, path, line=entry["line"], action=where, text=new)
            blank = b"\n\n"
            expected = (original[:start] + new.encode() + blank + original[start:] if where == "insert-before"
                        else original[:end] + blank + new.encode() + original[end:])
        assert not result["isError"], result
        assert path.read_bytes() == expected, (path, entry["line"], action)
        structure = result["structuredContent"]
        compiled = structure["compiled"]
        assert compiled["success"], result
        after = outline(process, path)
        kinds = [(f["kind"], f.get("name")) for f in after]
        old = [(f["kind"], f.get("name")) for f in before]
        if action in ("reformat", "body"):
            assert kinds == old
        else:
            inserted = index if where == "insert-before" else index + 1
            assert kinds[:inserted] + kinds[inserted + 1:] == old
            assert (after[inserted]["kind"], after[inserted]["line"]) == ("defun", structure["line"])
            place = definition_line(process, qualified(f"cl-mcp-inserted-{index}", compiled["package"]))
            assert (place["line"], place["place"]) == (structure["line"], "unchanged"), place
            if action == "insert-delete":
                deleted = edit(process, path, form=f"defun cl-mcp-inserted-{index}", action="delete")
                assert not deleted["isError"], deleted
                assert path.read_bytes() == original
        if action == "body" or (action == "reformat" and entry["kind"] == "defun"):
            place = definition_line(process, qualified(entry["name"], compiled["package"]))
            assert (place["line"], place["place"]) == (structure["line"], "unchanged"), place
        for note in compiled["notes"]:
            if "line" in note:
                assert structure["line"] <= note["line"] <= structure["endLine"], note


@pytest.mark.parametrize("library, system, files", [
    ("cl-split-sequence", "split-sequence", ["api.lisp", "list.lisp", "vector.lisp"]),
    ("cl-ppcre", "cl-ppcre", ["util.lisp", "specials.lisp"]),
])
def test_seeded_random_edits_keep_every_other_byte(lisp, tmp_path, library, system, files):
    directory = loaded_copy(lisp, DEBIAN / library, system, tmp_path)
    rng = random.Random(f"{library}-38")
    for name in files:
        random_edits(lisp, directory / name, rng)
    loaded = lisp.call("load-system", system=system)
    assert not loaded["isError"], loaded


BROKEN = [
    ("a missing paren", "(defun check-bounds (sequence start end)\n  (list sequence start end)",
     "a list is not closed", (2, 28), (1, 1)),
    ("an extra paren", "(defun check-bounds (sequence start end)\n  (list sequence start end)))",
     "a ) closes nothing", (2, 29), None),
    ("a stray #|", "(defun check-bounds (sequence start end)\n  #| (list sequence start end))",
     "a #| comment is not closed", (2, 32), (2, 3)),
    ("an unterminated string", "(defun check-bounds (sequence start end)\n  \"oops (list sequence start end))",
     "a string is not closed", (2, 35), (2, 3)),
    ("a symbol in no package", "(defun check-bounds (sequence start end)\n  (no-such-package::list sequence))",
     "no-such-package", (2, 25), None),
]


@pytest.mark.parametrize("label, text, what, stop, opened", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_texts_are_refused_and_the_file_is_unchanged(lisp, tmp_path, label, text, what, stop, opened):
    directory = loaded_copy(lisp, DEBIAN / "cl-split-sequence", "split-sequence", tmp_path)
    api = directory / "api.lisp"
    original = api.read_bytes()
    result = edit(lisp, api, form="defun check-bounds", text=text)
    assert result["isError"], result
    structure = result["structuredContent"]
    assert structure["written"] is False
    problem = structure["problem"]
    assert what.lower() in problem["what"].lower(), problem
    assert (problem["line"], problem["column"]) == stop, problem
    if opened:
        assert (problem["openedLine"], problem["openedColumn"]) == opened, problem
        opening = text.splitlines()[opened[0] - 1][opened[1] - 1:][:40]
        assert problem["opening"] == opening and f": {opening})" in structure["error"]["message"]
    assert problem["fix"]
    assert api.read_bytes() == original
    assert not list(directory.glob("api.lisp.*")), "a temporary file was left"


AMBIGUOUS = """(in-package :cl-user)

(defgeneric area (shape))

(defmethod area ((shape list)) (length shape))

(defmethod area :around ((shape list)) (call-next-method))

(defmethod area ((shape string)) 0)
"""


def test_methods_are_told_apart_and_an_ambiguous_name_lists_them(lisp, tmp_path):
    path = tmp_path / "shapes.lisp"
    path.write_text(AMBIGUOUS)
    loaded, is_error = lisp.eval(f'(load "{path}")')
    assert not is_error, loaded
    result = edit(lisp, path, form="defmethod area", text="(defmethod area ((shape list)) 1)")
    assert result["isError"] and result["structuredContent"]["error"]["type"] == "CL-MCP:AMBIGUOUS-FORM"
    assert [c["line"] for c in result["structuredContent"]["candidates"]] == [5, 7, 9]
    assert "line 7: defmethod area :around (list)" in result["content"][0]["text"]
    assert path.read_text() == AMBIGUOUS
    result = edit(lisp, path, form="defmethod area :around (list)",
                  text="(defmethod area :around ((shape list)) (1+ (call-next-method)))")
    assert not result["isError"], result
    assert path.read_text() == AMBIGUOUS.replace("(call-next-method))", "(1+ (call-next-method)))")
    text, _ = lisp.eval("(area '(a b))")
    assert text == "=> 3", text
    result = edit(lisp, path, form="defmethod area (shape)", action="delete")  # by parameter names
    assert result["isError"] and len(result["structuredContent"]["candidates"]) == 2
    for arguments in ({}, {"form": "defgeneric area", "line": 3}):
        result = edit(lisp, path, action="delete", **arguments)
        assert result["structuredContent"]["error"]["type"] == "CL-MCP:INVALID-ARGUMENTS", result
        result = checked_call(lisp, "read-lisp-file", path=str(path), mode="form", **arguments)
        assert result["structuredContent"]["error"]["type"] == "CL-MCP:INVALID-ARGUMENTS", result


READTABLE = """(defpackage :cl-mcp-brackets (:use :cl :named-readtables))
(in-package :cl-mcp-brackets)

(defreadtable brackets
  (:merge :standard)
  (:macro-char #\\[ (lambda (stream char)
                     (declare (ignore char))
                     (read-delimited-list #\\] stream t)))
  (:macro-char #\\] (get-macro-character #\\))))

(in-readtable brackets)

(defun numbers () '[1 2 3])
"""


def test_a_named_readtable_file_is_edited_and_compiled_in_its_readtable(lisp, tmp_path):
    assert not lisp.call("load-system", system="named-readtables")["isError"]
    path = tmp_path / "brackets.lisp"
    path.write_text(READTABLE)
    loaded, is_error = lisp.eval(f'(load "{path}")')
    assert not is_error, loaded
    forms = outline(lisp, path)
    assert forms[-1]["name"] == "numbers"
    contexts = checked_call(lisp, "read-lisp-file", path=str(path))["structuredContent"]["contexts"]
    assert contexts[-1] == {"line": 13, "package": "CL-MCP-BRACKETS", "readtable": "BRACKETS"}, contexts
    result = edit(lisp, path, form="defun numbers", text="(defun numbers () '[4 [5 6]])")
    assert not result["isError"] and result["structuredContent"]["compiled"]["success"], result
    text, _ = lisp.eval("(cl-mcp-brackets::numbers)")
    assert text == "=> (4 (5 6))", text
    refused = edit(lisp, path, form="defun numbers", text="(defun numbers () '[4 5)")
    assert refused["isError"] and refused["structuredContent"]["written"] is False, refused
    assert path.read_text() == READTABLE.replace("'[1 2 3]", "'[4 [5 6]]")


BRACES = """(defpackage :cl-mcp-braces (:use :cl :named-readtables))
(in-package :cl-mcp-braces)

(defreadtable braces
  (:merge :standard)
  (:macro-char #\\{ (lambda (stream char)
                     (declare (ignore char))
                     (coerce (loop for c = (read-char stream t nil t) until (char= c #\\}) collect c)
                             'string))))

(in-readtable braces)

(defun greeting () {hello})

(defun after () :after)
"""


INCREMENTS = """(defpackage :cl-mcp-increments (:use :cl :named-readtables))
(in-package :cl-mcp-increments)

(defreadtable increments
  (:merge :standard)
  (:macro-char #\\$ (lambda (stream char)
                     (declare (ignore char))
                     (1+ (read stream t nil t)))))

(in-readtable increments)

(defun answer () $41)

(defun after () :after)
"""


def test_a_reader_macro_that_ignores_read_suppress_leaves_its_forms_to_the_scan_and_says_so(lisp, tmp_path):
    """`$` adds 1 to what it reads, also to the nil a read returns under
    *read-suppress*, where the reader only finds where a form ends: that
    signalled a TYPE-ERROR, and the file was refused whole ("does not read
    as it is") by edit-form and read-lisp-file alike.  Such a form is
    delimited by the scan, and both say so."""
    assert not lisp.call("load-system", system="named-readtables")["isError"]
    path = tmp_path / "increments.lisp"
    path.write_text(INCREMENTS)
    loaded, is_error = lisp.eval(f'(load "{path}")')
    assert not is_error, loaded
    listed = checked_call(lisp, "read-lisp-file", path=str(path))
    assert not listed["isError"], listed
    assert [entry["name"] for entry in listed["structuredContent"]["forms"]][-2:] == ["answer", "after"]
    assert listed["structuredContent"]["scanned"] == 1, listed  # the form with a $
    assert "[1 form delimited as standard syntax: a reader macro of the file's readtable fails" in listed["content"][0]["text"]
    result = edit(lisp, path, form="defun answer", text="(defun answer () $99)")
    assert not result["isError"] and result["structuredContent"]["compiled"]["success"], result
    assert "(delimited as standard syntax where a reader macro" in result["content"][0]["text"].split("\n")[0], result
    assert lisp.eval("(cl-mcp-increments::answer)") == ("=> 100", False)
    assert path.read_text() == INCREMENTS.replace("$41", "$99")


def test_a_text_that_reads_only_in_the_files_readtable_is_written(lisp, tmp_path):
    """Its {...} swallows a ( and a ; that the byte scanner, which knows only
    the standard syntax, took for an unclosed list and a comment, and
    refused the text as unbalanced (issue 44, item 11): the text is delimited by the reader, in the file's readtable;
    a file whose readtable the image lacks is delimited as standard syntax,
    and the answer says so."""
    assert not lisp.call("load-system", system="named-readtables")["isError"]
    path = tmp_path / "braces.lisp"
    path.write_text(BRACES)
    loaded, is_error = lisp.eval(f'(load "{path}")')
    assert not is_error, loaded
    result = edit(lisp, path, form="defun greeting", text="(defun greeting () {a ( b ; c})")
    assert not result["isError"] and result["structuredContent"]["compiled"]["success"], result
    assert lisp.eval("(cl-mcp-braces::greeting)") == ('=> "a ( b ; c"', False)
    assert path.read_text() == BRACES.replace("{hello}", "{a ( b ; c}")
    assert [entry["name"] for entry in outline(lisp, path)][-2:] == ["greeting", "after"]
    refused = edit(lisp, path, form="defun greeting", text="(defun greeting () {never closed)")
    assert refused["structuredContent"]["error"]["type"] == "CL-MCP:UNBALANCED", refused
    assert "read in its readtable" in refused["content"][0]["text"], refused
    assert path.read_text() == BRACES.replace("{hello}", "{a ( b ; c}")

    elsewhere = tmp_path / "elsewhere.lisp"
    elsewhere.write_text("(in-package :cl-user)\n(in-readtable cl-mcp-nowhere-syntax)\n\n(defun cl-mcp-elsewhere () 1)\n")
    result = edit(lisp, elsewhere, form="defun cl-mcp-elsewhere", text="(defun cl-mcp-elsewhere () 2)",
                  compile=False)
    assert not result["isError"], result
    assert ("the file's readtable CL-MCP-NOWHERE-SYNTAX is not in the image: the text was delimited "
            "as standard syntax") in result["content"][0]["text"], result


LAMBDAS = """(in-package :cl-mcp-lambdas)
(in-readtable lambdas)

(defun doubled (list)
  (mapcar [x (* 2 x)] list))
"""


def test_compile_form_reads_in_the_files_named_readtable(lisp, tmp_path):
    """The package and readtable exist, but the file was never loaded: no
    in-readtable has told Swank's *readtable-alist* (as C-c C-c in a buffer
    of that file still reads right)."""
    assert not lisp.call("load-system", system="named-readtables")["isError"]
    defined, is_error = lisp.eval(
        "(defpackage :cl-mcp-lambdas (:use :cl :named-readtables))"
        "(named-readtables:defreadtable cl-mcp-lambdas::lambdas (:merge :standard)"
        "  (:macro-char #\\[ (lambda (stream char) (declare (ignore char))"
        "    (let ((list (read-delimited-list #\\] stream t)))"
        "      `(lambda (,(first list)) ,@(rest list)))))"
        "  (:macro-char #\\] (get-macro-character #\\))))")
    assert not is_error, defined
    path = tmp_path / "lambdas.lisp"
    path.write_text(LAMBDAS)
    compiled = checked_call(lisp, "compile-form", path=str(path), line=5)
    assert not compiled["isError"] and compiled["structuredContent"]["notes"] == [], compiled
    assert lisp.eval("(cl-mcp-lambdas::doubled '(1 2 3))") == ("=> (2 4 6)", False)


def test_outline_check_and_one_form_of_a_large_file(lisp, tmp_path):
    directory = loaded_copy(lisp, DEBIAN / "iterate", "iterate", tmp_path)
    path = directory / "iterate.lisp"
    forms = outline(lisp, path)
    lines = path.read_text().splitlines()
    assert len(lines) > 3000 and len(forms) > 200
    # As wc -l counts them: the file ends in a newline, after which no line begins.
    assert checked_call(lisp, "read-lisp-file", path=str(path))["structuredContent"]["lines"] == len(lines)
    for entry in forms:
        assert lines[entry["line"] - 1].strip(), entry
    contexts = checked_call(lisp, "read-lisp-file", path=str(path))["structuredContent"]["contexts"]
    assert [c["package"] for c in contexts] == ["COMMON-LISP-USER", "ITERATE"]
    walk = next(entry for entry in forms if entry.get("name") == "walk-arglist")
    one = checked_call(lisp, "read-lisp-file", path=str(path), mode="form", form="defun walk-arglist")
    text = one["structuredContent"]["forms"][0]["text"]
    assert text == "\n".join(lines[walk["line"] - 1:walk["endLine"]])
    clean = checked_call(lisp, "read-lisp-file", path=str(directory / "package.lisp"), mode="check")
    assert not clean["isError"] and clean["structuredContent"]["problems"] == []
    assert checked_call(lisp, "read-lisp-file", path=str(directory / "package.lisp"), mode="form",
                        form="defpackage iterate")["structuredContent"]["forms"][0]["kind"] == "defpackage"
    assert clean["content"][0]["text"].endswith(f"reads: {clean['structuredContent']['count']} top-level forms")
    package = directory / "package.lisp"
    package.write_text(package.read_text() + ")\n(in-package #:iterate))\n(defvar *after* 1)\n")
    strays = checked_call(lisp, "read-lisp-file", path=str(package), mode="check")
    end = len(package.read_text().splitlines())
    assert [(p["line"], p["column"], p["what"], p.get("formLine")) for p in strays["structuredContent"]["problems"]] \
        == [(end - 2, 1, "a ) closes nothing", 28), (end - 1, 23, "a ) closes nothing", end - 1)], strays
    assert strays["structuredContent"]["count"] == clean["structuredContent"]["count"] + 2
    path.write_text(path.read_text().replace("(defun walk-arglist (args)", "(defun walk-arglist ((args)"))
    broken = checked_call(lisp, "read-lisp-file", path=str(path), mode="check")
    *before, problem = broken["structuredContent"]["problems"]  # before: iterate's #L, not in the readtable
    assert all(p["line"] < walk["line"] and "#\\L" in p["message"] for p in before), before
    assert broken["isError"] and problem["formLine"] == walk["line"], broken
    assert (problem["openedLine"], problem["openedColumn"]) == (walk["line"], 1)
    assert broken["structuredContent"]["count"] == forms.index(walk)  # the forms before it are read


EMACS_SOURCE = """\
(in-package #:cl-user)

(defun edited-from-cl-mcp (x)
  (* x 2))
"""


def test_emacs_sees_the_edit_when_it_reverts_and_m_dot_lands_on_the_new_line(tmp_path):
    with shared_with_emacs() as (_server, emacs, process, home):
        path = home / "edited-by-cl-mcp.lisp"
        path.write_text(EMACS_SOURCE)
        loaded, is_error = process.eval(f'(load (compile-file "{path}"))')
        assert not is_error, loaded
        emacs.eval(f'(find-file-noselect "{path}")')
        above = "(defvar *edited-above* 1)"
        assert not edit(process, path, form="defun edited-from-cl-mcp", action="insert-before",
                        text=above)["isError"]
        result = edit(process, path, form="defun edited-from-cl-mcp", text="(defun edited-from-cl-mcp (x)\n  (* x 3))")
        assert not result["isError"] and result["structuredContent"]["line"] == 5, result
        expected = EMACS_SOURCE.replace("(defun", f"{above}\n\n(defun").replace("2)", "3)")
        assert path.read_text() == expected
        text = emacs.text(f'(with-current-buffer (get-file-buffer "{path}") (revert-buffer t t) '
                          "(buffer-substring-no-properties (point-min) (point-max)))")
        assert text == expected, text
        landed = emacs.eval('(progn (slime-edit-definition "cl-user::edited-from-cl-mcp") '
                            "(list (buffer-file-name) (line-number-at-pos)))")
        assert landed == f'("{path}" 5)', landed
        assert emacs.slime_eval("(cl-user::edited-from-cl-mcp 2)") == "6"


def test_the_write_keeps_the_mode_and_is_refused_when_the_file_changed_meanwhile(lisp, tmp_path):
    path = tmp_path / "changing.lisp"
    path.write_text(EMACS_SOURCE)
    path.chmod(0o640)
    result = edit(lisp, path, line=3, text="(defun edited-from-cl-mcp (x)\n  (* x 4))")
    assert not result["isError"], result
    assert path.stat().st_mode & 0o7777 == 0o640
    assert path.read_text() == EMACS_SOURCE.replace("2)", "4)")
    # The write as edit-form makes it, with the bytes the form was found in
    # no longer on disk: what another editor's write between the two does.
    text, is_error = lisp.eval(
        f'(cl-mcp-agent::write-atomically "{path}" (sb-ext:string-to-octets "(stale)") '
        '(sb-ext:string-to-octets "(new)") (lambda () (error "not written")))')
    assert not is_error and "CL-MCP:FILE-CHANGED" in text, text
    assert path.read_text() == EMACS_SOURCE.replace("2)", "4)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changing.lisp"]


def test_a_compile_that_fails_leaves_the_edit_written_and_gives_its_notes(lisp, tmp_path):
    path = tmp_path / "failing.lisp"
    path.write_text(EMACS_SOURCE)
    broken = "(defun edited-from-cl-mcp (x)\n  (let ((1 x))\n    x))"
    result = edit(lisp, path, form="defun edited-from-cl-mcp", text=broken)
    assert result["isError"], result
    structure = result["structuredContent"]
    assert structure["written"] is True and structure["compiled"]["success"] is False, structure
    assert "(the edit is written, and stays written)" in result["content"][0]["text"]
    assert path.read_text() == EMACS_SOURCE.replace("(defun edited-from-cl-mcp (x)\n  (* x 2))", broken)
    errors = [note for note in structure["compiled"]["notes"] if note["severity"] == "error"]
    assert errors and all(3 <= note["line"] <= 5 for note in errors), structure


def test_a_write_that_fails_is_an_error_and_nothing_is_written(lisp, tmp_path):
    path = tmp_path / "unwritable.lisp"
    path.write_text(EMACS_SOURCE)
    pid, is_error = lisp.eval("(sb-posix:getpid)")
    assert not is_error, pid
    (tmp_path / f"unwritable.lisp.cl-mcp-{pid.removeprefix('=> ')}").mkdir()  # where the write goes
    result = edit(lisp, path, line=3, text="(defun edited-from-cl-mcp (x)\n  (* x 5))")
    assert result["isError"] and result["structuredContent"]["written"] is False, result
    # The open that failed is the error, not the clean-up after it.
    assert "Error opening" in result["content"][0]["text"] and "delete" not in result["content"][0]["text"]
    assert path.read_text() == EMACS_SOURCE
    text, is_error = lisp.eval("(+ 1 2)")  # no debugger took the call's thread
    assert (text, is_error) == ("=> 3", False)


def test_crlf_line_endings_and_utf_8_are_kept_byte_for_byte(lisp, tmp_path):
    path = tmp_path / "crlf.lisp"
    original = ("(in-package :cl-user)\r\n\r\n;; c\r\n(defun crlf-a () 1)\r\n\r\n"
                "(defun crlf-b () \"été\")\r\n").encode()
    path.write_bytes(original)
    assert not edit(lisp, path, form="defun crlf-a", action="insert-after", text="(defun crlf-c () 3)")["isError"]
    assert path.read_bytes() == original.replace(b"1)\r\n", b"1)\r\n\r\n(defun crlf-c () 3)\r\n")
    assert not edit(lisp, path, form="defun crlf-c", action="delete")["isError"]
    assert path.read_bytes() == original
    result = edit(lisp, path, form="defun crlf-b", text="(defun crlf-b () \"ça\")")
    assert not result["isError"] and result["structuredContent"]["line"] == 6, result
    assert path.read_bytes() == original.replace("été".encode(), "ça".encode())
    place = definition_line(lisp, "cl-user::crlf-b")
    assert (place["line"], place["place"]) == (6, "unchanged"), place
    path.write_bytes(path.read_bytes().removesuffix(b"\r\n"))  # the last form, no newline after it
    assert not edit(lisp, path, form="defun crlf-b", action="delete")["isError"]
    assert path.read_bytes() == b"(in-package :cl-user)\r\n\r\n;; c\r\n(defun crlf-a () 1)\r\n"


def test_a_file_over_the_limit_is_refused_before_it_is_read(lisp, tmp_path):
    """Issue 44: the tools read a file whole, several times over, in the
    image's heap (the programmer's, attached): a 40 MB file's check took a
    1 GiB heap.  Over 16 MiB, every tool that reads a file refuses it, and
    the image conses nothing like the file's size."""
    big = tmp_path / "big.lisp"
    line = ";; " + "x" * 96 + "\n"
    with big.open("w") as out:
        out.write("(defun big-file-fn () 1)\n")
        out.write(line * (17 * 1024 * 1024 // len(line)))
    size = big.stat().st_size
    consed = "(sb-ext:get-bytes-consed)"
    before = int(lisp.eval(consed)[0].removeprefix("=> "))
    calls = [("read-lisp-file", {"path": str(big), "mode": mode}) for mode in ("outline", "check")]
    calls += [("read-lisp-file", {"path": str(big), "mode": "form", "line": 1}),
              ("edit-form", {"path": str(big), "line": 1, "text": "(defun big-file-fn () 2)"}),
              ("compile-form", {"path": str(big), "line": 1}),
              ("compile-file", {"path": str(big)})]
    for tool, arguments in calls:
        result = lisp.call(tool, **arguments)
        text = result["content"][0]["text"]
        assert result["isError"], (tool, text)
        assert text.startswith(f"[ERROR] CL-MCP:FILE-TOO-LARGE\n{big} holds {size:,} bytes; "
                               "the tools read files of at most 16,777,216 bytes (16 MiB)"), (tool, text)
    assert int(lisp.eval(consed)[0].removeprefix("=> ")) - before < size // 4  # nothing was read
    assert big.read_text().startswith("(defun big-file-fn () 1)\n")  # nor written
    assert lisp.eval("(fboundp 'big-file-fn)") == ("=> NIL", False)


@pytest.mark.parametrize("action", ["replace", "insert-after"])
def test_a_new_text_ending_in_a_comment_never_takes_the_next_form(lisp, tmp_path, action):
    """Issue 44: replacing `(defun a () 1)` of `(defun a () 1) (defun b () 2)`
    with `(defun a () 10) ; was 1` answered success, and `b` had left the
    file's forms, commented out.  A newline now ends such a text, and the
    answer says why; every other form reads as before."""
    path = tmp_path / "two.lisp"
    path.write_text("(defun comment-a () 1) (defun comment-b () 2)\n")
    result = lisp.call("edit-form", path=str(path), form="defun comment-a", action=action,
                       text="(defun comment-a () 10) ; was 1")
    text = result["content"][0]["text"]
    assert not result["isError"], text
    assert "(a newline was put after it: its last line ends in a comment" in text.splitlines()[0], text
    assert result["structuredContent"]["line"] == result["structuredContent"]["endLine"] == (
        1 if action == "replace" else 3)
    assert [(form["kind"], form["name"]) for form in outline(lisp, path)] == (
        [("defun", "comment-a"), ("defun", "comment-b")] if action == "replace" else
        [("defun", "comment-a"), ("defun", "comment-a"), ("defun", "comment-b")])
    assert "(defun comment-b () 2)" in path.read_text()


def test_the_edits_compile_gives_compile_forms_notes(lisp, tmp_path):
    """Issue 44: the edit's compile ran inside the guard that muffles
    warnings, and answered "0 notes" where compile-form of the same form
    right after gave its STYLE-WARNING.  One compile, one set of notes."""
    path = tmp_path / "noted.lisp"
    path.write_text("(defun noted-first () 1)\n")
    edited = lisp.call("edit-form", path=str(path), form="defun noted-first", action="insert-after",
                       text="(defun noted-second (x) (let ((noted-unused 1)) (list x)))")
    notes = edited["structuredContent"]["compiled"]["notes"]
    assert [(note["severity"], note["message"]) for note in notes] == [
        ("style-warning", "The variable NOTED-UNUSED is defined but never used.")], edited
    compiled = lisp.call("compile-form", path=str(path), line=edited["structuredContent"]["line"])
    assert compiled["structuredContent"]["notes"] == notes


QUIET_SOURCE = """\
(in-package :cl-user)

(defun quiet-fn-q1 (&key quiet-key-q2)
  #.(progn (defparameter cl-user::*quiet-read-ran-q0* t) 1))

(defvar quiet-pkg-q3::*quiet-var-q4* (list :quiet-kw-q5 cl-user::quiet-qualified-q6 #+quiet-feature-q7 1))

(defmethod quiet-method-q8 ((x quiet-class-q9)) x)

(defun quiet-broken-q10 () (quiet-nowhere-q11:f))
"""

QUIET_NAMES = {"COMMON-LISP-USER": ["*QUIET-READ-RAN-Q0*", "QUIET-FN-Q1", "QUIET-KEY-Q2", "QUIET-QUALIFIED-Q6",
                                    "QUIET-METHOD-Q8", "QUIET-CLASS-Q9", "QUIET-BROKEN-Q10"],
               "QUIET-PKG-Q3": ["*QUIET-VAR-Q4*"],
               "KEYWORD": ["QUIET-KEY-Q2", "QUIET-KW-Q5", "QUIET-FEATURE-Q7", "QUIET-FN-Q1"]}


def found_symbols(process, names: dict[str, list[str]]) -> str:
    """The symbols of NAMES present in their packages, asked without reading any of them."""
    pairs = " ".join(f'("{package}" "{name}")' for package, listed in names.items() for name in listed)
    return process.eval("(loop for (package name) in '(" + pairs + ")"
                        " when (nth-value 1 (find-symbol name package)) collect (list package name))")[0]


def test_reading_a_file_runs_nothing_and_interns_nothing(lisp, tmp_path):
    """Issue 44: read-lisp-file is read-only, yet its check ran a #. in the
    (programmer's) image, even while they held the assistant, and every mode
    interned the names it read into their packages: their next use-package
    failed with a NAME-CONFLICT.  Now no mode runs a #. (the check says how
    many it read without evaluating), and no package gains a symbol:
    unqualified names, qualified ones in an existing package, keywords, and
    the features of #+ alike."""
    lisp.eval("(defpackage :quiet-pkg-q3 (:use :cl))")
    path = tmp_path / "quiet.lisp"
    path.write_text(QUIET_SOURCE)
    assert found_symbols(lisp, QUIET_NAMES) == "=> NIL"
    forms = outline(lisp, path)
    assert [(f["kind"], f.get("name")) for f in forms] == [
        ("in-package", ":cl-user"), ("defun", "quiet-fn-q1"), ("defvar", "quiet-pkg-q3::*quiet-var-q4*"),
        ("defmethod", "quiet-method-q8 (quiet-class-q9)"), ("defun", "quiet-broken-q10")]
    checked = checked_call(lisp, "read-lisp-file", path=str(path), mode="check")
    assert [(p["line"], p.get("name")) for p in checked["structuredContent"]["problems"]] == [(10, "quiet-broken-q10")]
    assert checked["structuredContent"]["unevaluated"] == 1
    assert "[1 #. form read without being evaluated: reading a file runs none of its code]" \
        in checked["content"][0]["text"]
    for target, line in (("defmethod quiet-method-q8 (quiet-class-q9)", 8), ("defun quiet-fn-q1", 3),
                         ("defvar quiet-pkg-q3::*quiet-var-q4*", 6)):
        one = checked_call(lisp, "read-lisp-file", path=str(path), mode="form", form=target)
        assert one["structuredContent"]["forms"][0]["line"] == line, (target, one)
    assert found_symbols(lisp, QUIET_NAMES) == "=> NIL"
    used = lisp.eval("(progn (defpackage :quiet-exporter-q12 (:use) (:export #:quiet-fn-q1))"
                     " (use-package :quiet-exporter-q12 :cl-user)"
                     " (unuse-package :quiet-exporter-q12 :cl-user) (delete-package :quiet-exporter-q12) :used)")
    assert used == ("=> :USED", False)


def test_an_outline_needs_no_package_nor_named_readtables(tmp_path):
    """Issue 44: an outline of a file that begins (in-package #:x)
    (in-readtable :interpol-syntax) answered PACKAGE-DOES-NOT-EXIST
    "NAMED-READTABLES" in an image without named-readtables."""
    path = tmp_path / "interpolated.lisp"
    path.write_text("(in-package #:quiet-nowhere-x)\n(in-readtable :interpol-syntax)\n\n"
                    "(defun greet (name) #?\"Hello ${name}\")\n")
    for mode in MODES:
        with cl_mcp_in(mode) as fresh:
            assert fresh.eval('(find-package "NAMED-READTABLES")') == ("=> NIL", False)
            result = checked_call(fresh, "read-lisp-file", path=str(path))
            assert not result["isError"], result
            assert [(f["line"], f["kind"], f.get("name")) for f in result["structuredContent"]["forms"]] == [
                (1, "in-package", "#:quiet-nowhere-x"), (2, "in-readtable", ":interpol-syntax"),
                (4, "defun", "greet")]
            assert result["structuredContent"]["contexts"][-1] == {
                "line": 4, "package": "missing", "readtable": "INTERPOL-SYNTAX"}


def test_what_a_reply_holds_fits_a_swank_frame_and_says_how_to_read_the_rest(lisp, tmp_path):
    """Issue 44: read-lisp-file's outline of a 1 MB file of 250,000 one-line
    forms answered CONNECTION-LOST (Swank's header holds 24 bits of length),
    and the next call NOT-CONNECTED.  An outline lists 5,000 forms and the
    line to go on from; a form's text and a check's problems are capped
    too, each saying how much was left out."""
    path = tmp_path / "many.lisp"
    path.write_text("(a)\n" * 250_000)
    first = checked_call(lisp, "read-lisp-file", path=str(path))
    structure = first["structuredContent"]
    assert (structure["count"], structure["next"]) == (250_000, 5_001)
    assert first["content"][0]["text"].endswith(
        "\n5000 form (a)\n[245000 more forms from line 5001 on: read-lisp-file with line 5001]")
    last = checked_call(lisp, "read-lisp-file", path=str(path), line=249_900)
    assert [f["line"] for f in last["structuredContent"]["forms"]] == list(range(249_900, 250_001))
    assert "next" not in last["structuredContent"]
    assert "[the 249899 forms above line 249900 are left out]" in last["content"][0]["text"]
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)  # the same connection
    limits = "(cl-mcp-agent::*form-text-limit* cl-mcp-agent::*problem-limit*)"
    assert lisp.eval(f"(setf {limits.replace('(', '(values ', 1)} (values 100 2))")[1] is False
    try:
        long = tmp_path / "long.lisp"
        text = "(defparameter *long* '(" + " ".join(["x"] * 200) + "))"
        long.write_text(text + "\n")
        form = checked_call(lisp, "read-lisp-file", path=str(long), mode="form", line=1)
        assert form["structuredContent"]["forms"][0]["text"] == text[:100]
        assert form["structuredContent"]["textLength"] == len(text)
        assert form["content"][0]["text"].endswith(
            f"[the form is {len(text)} characters; its first 100 are shown: lines 1-1 of the file hold it all]")
        long.write_text(text + "\n)\n)\n)\n")
        checked = checked_call(lisp, "read-lisp-file", path=str(long), mode="check")
        assert (len(checked["structuredContent"]["problems"]), checked["structuredContent"]["problemCount"]) == (2, 3)
        assert checked["content"][0]["text"].startswith(f"{long}: 3 problems, the first 2 listed")
    finally:
        lisp.eval(f"(setf {limits.replace('(', '(values ', 1)} (values 1000000 1000))")


def test_compile_form_says_what_a_librarys_own_definer_defines(lisp, tmp_path):
    """It answered "defined: nothing named" for hunchentoot's
    define-easy-handler and ironclad's define-digest-finalizer (issue 43):
    what the expansion defines is named."""
    path = tmp_path / "definers.lisp"
    path.write_text("(in-package #:cl-user)\n\n"
                    "(defmacro define-cf-handler (name)\n"
                    "  `(progn (defvar ,(intern (format nil \"*~A-HITS*\" name)) 0)\n"
                    "          (define-cf-route ,name)))\n\n"
                    "(defmacro define-cf-route (name) `(defun ,name () :routed))\n\n"
                    "(define-cf-handler cf-served)\n\n(list :defines-nothing)\n")
    for line in (3, 7):
        assert not lisp.call("compile-form", path=str(path), line=line)["isError"]
    compiled = lisp.call("compile-form", path=str(path), line=9)
    assert compiled["structuredContent"]["defined"] == ["variable *CF-SERVED-HITS*", "function CF-SERVED"], compiled
    assert lisp.eval("(cf-served)") == ("=> :ROUTED", False)
    plain = lisp.call("compile-form", path=str(path), line=11)
    assert plain["structuredContent"]["defined"] == [] and "defined: nothing named" in plain["content"][0]["text"]



def test_compile_form_names_a_method_as_find_definition_does(lisp, tmp_path):
    """It said "defined: method (CF-SHAPE NIL (SYMBOL))" where
    find-definition says "method CF-SHAPE (SYMBOL)" (issue 49's trial
    replay, yason's ENCODE)."""
    path = tmp_path / "methods.lisp"
    path.write_text("(defgeneric cf-shape (x))\n\n(defmethod cf-shape ((x symbol)) x)\n\n"
                    "(defmethod cf-shape :after ((x integer)) x)\n")
    assert not lisp.call("compile-form", path=str(path), line=1)["isError"]
    for line, shown in ((3, "method CF-SHAPE (SYMBOL)"), (5, "method CF-SHAPE :AFTER (INTEGER)")):
        compiled = lisp.call("compile-form", path=str(path), line=line)
        assert compiled["structuredContent"]["defined"] == [shown], compiled
        found = lisp.call("find-definition", symbol="cf-shape")["content"][0]["text"]
        assert f"\n{shown}\n" in found, found


NOTED = "(defun noted-sum (x y)\n  (declare (optimize speed))\n  (let ((unused-z 1))\n    (+ x y)))\n"


def test_compile_form_and_edit_form_count_plain_notes_as_compile_file_does(lisp, tmp_path):
    """Issue 49, item 2: a one-token edit listed every optimisation note in
    full (about 45 lines in ironclad), where compile-file counts them unless
    asked. Warnings and style-warnings are still listed; notes "all" lists
    every note."""
    path = tmp_path / "noted.lisp"
    path.write_text(NOTED)
    every = checked_call(lisp, "compile-form", path=str(path), line=1, notes="all")
    plain = [n for n in every["structuredContent"]["notes"] if n["severity"] == "note"]
    styles = [n for n in every["structuredContent"]["notes"] if n["severity"] == "style-warning"]
    assert plain and styles, every
    counted = checked_call(lisp, "compile-form", path=str(path), line=1)
    assert counted["structuredContent"]["notes"] == styles, counted
    assert counted["structuredContent"]["noteCounts"] == [{"file": str(path), "count": len(plain)}]
    head = counted["content"][0]["text"].split("\n", 1)[0]
    assert head.endswith(f"{len(styles)} note{'' if len(styles) == 1 else 's'} listed,"
                         f" {len(plain)} compiler note{'' if len(plain) == 1 else 's'} counted"), head
    assert f"[compiler notes: {len(plain)}, counted per file, not listed" in counted["content"][0]["text"]
    edited = edit(lisp, path, line=1, text=NOTED.replace("(+ x y)", "(+ y x)"))
    compiled = edited["structuredContent"]["compiled"]
    assert compiled["notes"] and all(note["severity"] != "note" for note in compiled["notes"]), compiled
    assert edited["structuredContent"]["compiled"]["noteCounts"] == [{"file": str(path), "count": len(plain)}]
    all_of_them = edit(lisp, path, line=1, text=NOTED, notes="all")
    assert len(all_of_them["structuredContent"]["compiled"]["notes"]) == len(every["structuredContent"]["notes"])


def test_a_full_warning_does_not_fail_compile_form_or_edit_form(lisp, tmp_path):
    """docs/tools.md: warnings do not fail it.  A WARNING made Swank's
    compile-string-for-emacs answer failure (COMPILE-FILE's failure-p), and
    compile-form said COMPILATION-FAILED of a function it had compiled and
    loaded, where compile-file of the same file says loaded (issue 49's
    trial replay)."""
    path = tmp_path / "warns.lisp"
    path.write_text('(defun warns-once (x)\n  (+ x "two"))\n')
    compiled = checked_call(lisp, "compile-form", path=str(path), line=1)
    assert not compiled["isError"] and compiled["structuredContent"]["success"] is True, compiled
    assert [n["severity"] for n in compiled["structuredContent"]["notes"]] == ["warning"], compiled
    assert compiled["content"][0]["text"].startswith(f"Compiled the form at {path}:1-2 "), compiled
    assert lisp.eval("(and (fboundp 'warns-once) t)") == ("=> T", False)
    edited = edit(lisp, path, line=1, text='(defun warns-once (x)\n  (* x "three"))')
    assert not edited["isError"] and edited["structuredContent"]["compiled"]["success"] is True, edited
    broken = edit(lisp, path, line=1, text="(defun warns-once (x)\n  (let ((1 x)) x))")
    assert broken["isError"] and "COMPILATION-FAILED" in broken["content"][0]["text"], broken
