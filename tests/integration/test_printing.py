"""Printing values that cannot flood the image (agent/output.lisp, "Printing
that never fails"): a value is printed once, into a stream that keeps what
fits under the limit and stops the printer a little further on.

Each value's text is checked at its start and its end, which a result
budget (docs/tools.md) leaves in place when it cuts the middle of a long
result.  The memory tests measure bytes consed inside the image, not time.
"""

import re

import pytest

VALUE_LIMIT = 1_000_000  # cl-mcp-agent::*value-print-limit*
OVERRUN = 10_000  # cl-mcp-agent::*print-overrun*
STOPPED = f"\n… [printing stopped: more than {OVERRUN} more characters truncated]"

# Values whose whole printing would run to hundreds of megabytes (or never
# end), and how their printing begins.  The 100^4 tree shares its innermost
# lists: a tree of 100,000,000 distinct conses (1.6 GB) does not fit the
# image's 1 GB heap, and the labels make its printing a flood all the same.
FLOODS = {
    "a 50,000,000-character string": ('(make-string 50000000 :initial-element #\\a)', '=> "aaaaaaaaaa'),
    "a bit-vector of 100,000,000 bits": ("(make-array 100000000 :element-type 'bit)", "=> #*0000000000"),
    "a list of 100 strings of 1,000,000 characters (one logical block)":
        ("(loop repeat 100 collect (make-string 1000000 :initial-element #\\b :element-type 'base-char))",
         '=> ("bbbbbbbbbb'),
    "a tree of 100 lists of 100 lists of 100 lists of 100 (the innermost shared)":
        ("(let ((inner (make-list 100))) "
         "(loop repeat 100 collect (loop repeat 100 collect (loop repeat 100 collect inner))))",
         "=> (((#1=(NIL NIL"),
    "a tree of 100 lists of 100 lists of 100 numbers":
        ("(loop repeat 100 collect (loop repeat 100 collect (loop for i below 100 collect i)))",
         "=> (((0 1 2 3"),
    "a print-function that never ends":
        ("(defstruct (pr-endless (:print-function (lambda (o s d) (declare (ignore o d))"
         " (loop (write-string \"abc\" s)))))) (make-pr-endless)",
         "=> abcabcabc"),
}


@pytest.mark.parametrize("code, start", FLOODS.values(), ids=FLOODS.keys())
def test_a_huge_value_is_printed_up_to_the_limit_and_stopped(server, code, start):
    # A fresh image each: the image keeps the last evaluations' values
    # (cl-mcp-agent:value), and these are large.
    text, is_error = server.eval(code)
    assert not is_error, text[:2000]
    assert text.startswith(start)
    assert text.endswith(STOPPED)
    assert text.count("\n=> ") == 0  # one value
    assert len(text) <= len("=> ") + VALUE_LIMIT + len(STOPPED)
    assert server.eval("(+ 1 2)") == ("=> 3", False)


def test_a_ten_million_element_list_is_cut_by_print_length(server):
    text, is_error = server.eval("(make-list 10000000)")
    assert not is_error
    assert text.startswith("=> (NIL NIL") and " NIL ...)\n… [cut by *print-length* 100" in text
    assert text.count("NIL") == 100


PRINTER_CUT = "\n… [cut by *print-length* 100 or *print-level* 10"


def evaluated(process, code):
    """The text of CODE's result and the evaluation's number."""
    result = process.call("evaluate-lisp", code=code)
    assert not result["isError"], result
    return result["content"][0]["text"], result["structuredContent"]["number"]


CUT_BY_THE_PRINTER = {
    "*print-length*": ("(make-list 100000 :initial-element 7)", "(length *)", "=> 100000"),
    "*print-level*": ("(let ((x 0)) (dotimes (i 12) (setf x (list x))) x)",
                      "(loop for x = * then (first x) while (consp x) count t)", "=> 12"),
    "both, in a vector": ("(vector (make-list 101) (let ((x 0)) (dotimes (i 12) (setf x (list x))) x))",
                          "(length (aref * 0))", "=> 101"),
}


@pytest.mark.parametrize("code, measure, whole", CUT_BY_THE_PRINTER.values(), ids=CUT_BY_THE_PRINTER.keys())
def test_a_value_cut_by_the_printer_says_how_to_reach_it(shared_server, code, measure, whole):
    text, number = evaluated(shared_server, code)
    assert text.endswith(f"{PRINTER_CUT}; the value itself: (cl-mcp-agent:value {number})]\n\n; Evaluation {number}")
    assert shared_server.eval(measure.replace("*", f"(cl-mcp-agent:value {number})", 1)) == (whole, False)


@pytest.mark.parametrize("code", [
    "(make-list 100 :initial-element 7)",
    "(let ((x 0)) (dotimes (i 9) (setf x (list x))) x)",
    '(list "..." #\\# (quote |...|) (make-hash-table) (vector 1 2))',
    "(let ((l (list 1 2))) (list l l))",
])
def test_a_value_the_printer_did_not_cut_has_no_marker(shared_server, code):
    text, _ = evaluated(shared_server, code)
    assert "… [" not in text


def test_only_the_primary_value_is_reachable(shared_server):
    text, number = evaluated(shared_server, "(values (make-list 3) (make-list 200))")
    assert text.startswith("=> (NIL NIL NIL)\n=> (NIL")
    assert text.endswith(f" NIL ...){PRINTER_CUT}]\n\n; Evaluation {number}")


def test_a_value_cut_by_a_little_says_exactly_how_much(shared_server):
    # 1,000,007 characters with the quotes; later values get no room, but
    # short ones are still counted.
    text, is_error = shared_server.eval("(values (make-string 1000005 :initial-element #\\a) 42 \"xyz\")")
    assert not is_error
    assert text.startswith('=> "aaaa')
    assert text.endswith('\n… [7 more characters truncated]\n'
                         '=> \n… [2 more characters truncated]\n'
                         '=> \n… [5 more characters truncated]')


def test_values_after_a_stopped_one_are_stopped_too(server):
    text, is_error = server.eval("(let ((s (make-string 2000000 :initial-element #\\c))) (values s s))")
    assert not is_error
    assert text.startswith('=> "cccc')
    assert text.endswith(STOPPED + "\n=> " + STOPPED)


def test_a_print_object_error_with_a_huge_message_is_a_short_marker(shared_server):
    code = """(defclass pr-bad () ())
              (defmethod print-object ((o pr-bad) s)
                (write-string "partial" s)
                (error "~A" (make-string 10000000 :initial-element #\\x)))
              (make-instance 'pr-bad)"""
    text, is_error = shared_server.eval(code)
    assert not is_error
    assert text == "=> #<error printing object of type PR-BAD: " + "x" * 1000 + "…>"


# ---------------------------------------------------------------- circular and shared structure

def test_a_circular_list(shared_server):
    assert shared_server.eval("(let ((l (list 1 2 3))) (setf (cdr (last l)) l) l)") == ("=> #1=(1 2 3 . #1#)", False)


def test_a_long_circular_list_is_cut_by_print_length(shared_server):
    text, is_error = shared_server.eval(
        "(let ((l (make-list 1000000 :initial-element 0))) (setf (cdr (last l)) l) l)")
    assert not is_error
    assert text.startswith("=> (0 0 0") and " 0 ...)\n… [cut by *print-length* 100" in text


def test_a_circular_structure(shared_server):
    code = """(defstruct pr-node name next)
              (let ((a (make-pr-node :name :a)) (b (make-pr-node :name :b)))
                (setf (pr-node-next a) b (pr-node-next b) a)
                a)"""
    assert shared_server.eval(code) == ("=> #1=#S(PR-NODE :NAME :A :NEXT #S(PR-NODE :NAME :B :NEXT #1#))", False)


def test_a_huge_self_referencing_vector_is_stopped_with_its_labels(server):
    # A vector of 100 vectors of 100 vectors of 10 strings, every one of
    # which points back to the top: more than the limit, and every label
    # in what is kept is defined (#N=) before it is used (#N#).
    code = """(let ((top (make-array 101)))
                (dotimes (i 100)
                  (let ((v (make-array 101)))
                    (dotimes (j 100)
                      (let ((w (make-array 11)))
                        (dotimes (k 10)
                          (setf (aref w k) (make-string 40 :initial-element #\\s)))
                        (setf (aref w 10) top (aref v j) w)))
                    (setf (aref v 100) top (aref top i) v)))
                (setf (aref top 100) top)
                top)"""
    text, is_error = server.eval(code)
    assert not is_error
    assert text.startswith("=> #1=#(#(#(\"sss")
    # Each vector has 101 elements: *print-length* cut them too.
    assert text.endswith(STOPPED + PRINTER_CUT + "; the value itself: (cl-mcp-agent:value 1)]")
    assert "#1#" in text
    labels = re.findall(r"#(\d+)([=#])", text)
    defined: set[str] = set()
    for number, kind in labels:
        if kind == "=":
            assert number not in defined
            defined.add(number)
        else:
            assert number in defined


# ---------------------------------------------------------------- memory, measured in the image

def consed_while_printing(server, value_code: str, limit: int) -> int:
    """Bytes the image conses printing VALUE_CODE's value with a LIMIT."""
    text, is_error = server.eval(
        f"(let ((x {value_code}))"
        "  (sb-ext:gc :full t)"
        "  (let ((before (sb-ext:get-bytes-consed)))"
        f"   (cl-mcp-agent::print-values (list x) {limit})"
        "    (- (sb-ext:get-bytes-consed) before)))")
    assert not is_error, text
    assert text.startswith("=> ")
    return int(text[3:])


MB = 1_000_000

# What printing each value whole, then cutting it to 20,000 characters,
# consed before printing was bounded: about 450, 620, 640, 280 and 260 MB.
MEASURED = {
    "a 50,000,000-character string": '(make-string 50000000 :initial-element #\\a)',
    "a bit-vector of 100,000,000 bits": "(make-array 100000000 :element-type 'bit)",
    "a list of 100 strings of 1,000,000 characters":
        "(loop repeat 100 collect (make-string 1000000 :initial-element #\\b :element-type 'base-char))",
    "a tree of 100^4 (the innermost lists shared)":
        "(let ((inner (make-list 100))) "
        "(loop repeat 100 collect (loop repeat 100 collect (loop repeat 100 collect inner))))",
    "a tree of 100^3 numbers":
        "(loop repeat 100 collect (loop repeat 100 collect (loop for i below 100 collect i)))",
}


@pytest.mark.parametrize("code", MEASURED.values(), ids=MEASURED.keys())
def test_printing_a_huge_value_conses_little(shared_server, code):
    assert consed_while_printing(shared_server, code, 20_000) < 50 * MB


def test_printing_a_huge_string_to_the_full_limit_conses_little(shared_server):
    # Printing it whole conses 463 MB; a million characters kept, about 20.
    assert consed_while_printing(shared_server, '(make-string 50000000 :initial-element #\\a)', VALUE_LIMIT) < 100 * MB


@pytest.mark.parametrize("code, printed", [
    ('(let ((s "banana")) (list s s))', '=> ("banana" "banana")'),
    ("(let ((x (list 1 2))) (list x x))", "=> ((1 2) (1 2))"),
    ('(let* ((s "b") (x (list s s 1))) (setf (cdr (last x)) x) x)', '=> #1=("b" "b" 1 . #1#)'),
    ("(let ((v (vector 1 2))) (setf (aref v 0) v) v)", "=> #1=#(#1# 2)"),
])
def test_labels_mark_only_a_real_cycle_and_never_a_string(shared_server, code, printed):
    """Issue 49, item 1: a list of one string twice printed (#1="banana"
    #1#), and a cxml DOM showed #1# for every element's tag name after the
    first; shared parts that make no cycle print as they are, and inside a
    cycle a string is never labelled."""
    assert shared_server.eval(code) == (printed, False)
