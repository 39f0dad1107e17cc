"""Output written to an evaluation's stream after that evaluation ended
reaches the model in the threads' news ([threads] notice, read-output),
checked against the writer's own count of what it wrote: a plain thread
that kept the evaluation's *standard-output*, and lparallel's workers
(Debian's, from the corpus), whose kernel binds the *standard-output* and
*error-output* of the evaluation that made it."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.devtools import MODES, cl_mcp_in
from tests.integration.test_thread_news import notice_of

OUTPUT = re.compile(r'Output from threads since the last call: .*?read-output \{"evaluation": (\d+)\}')


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    defining = '(asdf:load-system "lparallel") (defvar *lo-written* (make-hash-table))'
    with cl_mcp_in(request.param, defining=defining) as process:
        yield process


def news_text(lisp, notice: str, stream: str) -> str:
    """The threads' output of STREAM that NOTICE's read-output calls give."""
    text = ""
    for number in OUTPUT.findall(notice):
        lines: list[str] = []
        while True:
            result = lisp.call("read-output", evaluation=int(number), stream=stream, offset=len(lines) + 1)
            if result["isError"]:  # this news had no output on STREAM
                break
            shown = result["structuredContent"]["lines"]
            lines += [line.split(": ", 1)[1] if ": " in line else "" for line in shown]
            if not shown or len(lines) >= result["structuredContent"]["totalLines"]:
                break
        text += "".join(line + "\n" for line in lines)
    return text


def written_by(text: str, thread: str) -> str:
    """What THREAD's lines of the threads' output say, its marks taken off:
    a line marked [THREAD]+ continues its line before (docs/tools.md)."""
    written = ""
    for line in text.splitlines(keepends=True):
        if line.startswith(f"[{thread}]+"):
            written = written[:-1] + line[len(thread) + 3:].removeprefix(" ")
        elif line.startswith(f"[{thread}]"):
            written += line[len(thread) + 2:].removeprefix(" ")
    return written


def wait_for(lisp, code: str, notice: str = "") -> str:
    """SEEN notices and those of evaluating CODE, repeated until it is true."""
    for _ in range(200):
        result = lisp.call("evaluate-lisp", code=code)
        assert not result["isError"], result
        notice += notice_of(result) + "\n"
        if result["structuredContent"]["values"][:1] != ["NIL"]:  # gethash's second value aside
            return notice
    raise AssertionError(f"{code} stayed false")


def test_a_thread_writing_to_an_ended_evaluations_stream_reaches_the_news(lisp):
    # The thread keeps this evaluation's stream and writes once it has ended
    # (it waits for the semaphore the next evaluation signals).
    result = lisp.call("evaluate-lisp", code="""
(defvar *lo-go* (sb-thread:make-semaphore))
(let ((out *standard-output*))
  (sb-thread:make-thread
   (lambda ()
     (sb-thread:wait-on-semaphore *lo-go*)
     (dotimes (i 300)
       (let ((line (format nil "late line ~D~%" i)))
         (write-string line out)
         (incf (gethash :plain *lo-written* 0) (length line))))
     (setf (gethash :plain-done *lo-written*) t))
   :name "lo-keeper"))""")
    assert not result["isError"], result
    notice = notice_of(result)
    notice = wait_for(lisp, "(sb-thread:signal-semaphore *lo-go*) (gethash :plain-done *lo-written*)", notice)
    notice = wait_for(lisp, "t", notice)  # the news of the last writes, if they came after the reply
    text = written_by(news_text(lisp, notice, "stdout"), "lo-keeper")
    count = int(lisp.eval("(gethash :plain *lo-written*)")[0].split()[1])
    assert (len(text), text) == (count, "".join(f"late line {i}\n" for i in range(300)))


def test_a_line_begun_before_a_reply_and_ended_after_reaches_the_news_whole(lisp):
    # Cut where a reply took the news and where another thread wrote, its
    # rest came as a line of its own: "begun, " and "ended" read as two.
    result = lisp.call("evaluate-lisp", code="""
(defvar *lo-half* (sb-thread:make-semaphore))
(defvar *lo-rest* (sb-thread:make-semaphore))
(defparameter *lo-splitter*
  (sb-thread:make-thread (lambda ()
                           (write-string "begun, ")
                           (sb-thread:signal-semaphore *lo-half*)
                           (sb-thread:wait-on-semaphore *lo-rest*)
                           (write-line "ended"))
                         :name "lo-splitter"))""")
    assert not result["isError"], result
    notice = notice_of(result)
    for code in ('(sb-thread:wait-on-semaphore *lo-half*) (sb-thread:join-thread (sb-thread:make-thread '
                 '(lambda () (write-line "between")) :name "lo-between"))',
                 "(sb-thread:signal-semaphore *lo-rest*) (sb-thread:join-thread *lo-splitter*)"):
        result = lisp.call("evaluate-lisp", code=code)
        assert not result["isError"], result
        notice += notice_of(result) + "\n"
    text = news_text(lisp, notice, "stdout")
    assert (written_by(text, "lo-splitter"), written_by(text, "lo-between")) == ("begun, ended\n", "between\n"), text


def test_threads_of_one_name_each_have_their_lines_whole(lisp):
    # lparallel names every worker of a kernel alike: marked by the name
    # alone, the rest of a line cut by a reply could be either's.
    result = lisp.call("evaluate-lisp", code="""
(defvar *lo-twins-half* (sb-thread:make-semaphore))
(defvar *lo-twins-rest* (sb-thread:make-semaphore))
(defparameter *lo-twins*
  (loop for i below 2
        collect (let ((i i))
                  (sb-thread:make-thread (lambda ()
                                           (format t "twin ~D begun, " i)
                                           (sb-thread:signal-semaphore *lo-twins-half*)
                                           (sb-thread:wait-on-semaphore *lo-twins-rest*)
                                           (format t "ended ~D~%" i))
                                         :name "lo-twin"))))""")
    assert not result["isError"], result
    notice = notice_of(result)
    for code in ("(sb-thread:wait-on-semaphore *lo-twins-half* :n 2)",
                 "(sb-thread:signal-semaphore *lo-twins-rest* 2) (mapc #'sb-thread:join-thread *lo-twins*)"):
        result = lisp.call("evaluate-lisp", code=code)
        assert not result["isError"], result
        notice += notice_of(result) + "\n"
    text = news_text(lisp, notice, "stdout")
    labels = set(re.findall(r"^\[(lo-twin \(thread \d+\))\]", text, re.M))
    assert sorted(written_by(text, label) for label in labels) == ["twin 0 begun, ended 0\n",
                                                                  "twin 1 begun, ended 1\n"], text


def test_threads_writing_to_a_running_evaluations_stream_lose_nothing(lisp):
    # Their writes to its buffer raced: lparallel's workers in a PMAP the
    # evaluation ran lost up to half of what they wrote.
    result = lisp.call("evaluate-lisp", code="""
(let* ((out *standard-output*)
       (gate (sb-thread:make-semaphore))
       (threads (loop for i below 4
                      collect (let ((i i))
                                (sb-thread:make-thread
                                 (lambda ()
                                   (sb-thread:wait-on-semaphore gate)
                                   (dotimes (n 3000) (write-string (format nil "t~D ~D~%" i n) out))))))))
  (sb-thread:signal-semaphore gate 4)
  (mapc #'sb-thread:join-thread threads)
  (values))""")
    assert not result["isError"], result
    number = result["structuredContent"]["number"]
    lines: list[str] = []
    while True:
        shown = lisp.call("read-output", evaluation=number, offset=len(lines) + 1)["structuredContent"]
        lines += [line.split(": ", 1)[1] for line in shown["lines"]]
        if len(lines) >= shown["totalLines"]:
            break
    assert sorted(lines) == sorted(f"t{i} {n}" for i in range(4) for n in range(3000))


def test_an_evaluation_stopped_at_its_deadline_while_writing_holds_up_no_other_writer(lisp):
    # The evaluation writes all the time, so its deadline comes inside a
    # write; a thread writing to the same stream must go on while it waits.
    text, is_error = lisp.eval("""
(defvar *lo-progress* 0)
(let ((out *standard-output*))
  (sb-thread:make-thread (lambda () (loop (write-string "w" out) (incf *lo-progress*) (sleep 0.001)))
                         :name "lo-beside")
  (loop (write-string (make-string 4000 :initial-element #\\x) out)))""", timeout=1, wait=20)
    assert is_error and "deadline" in text, text
    try:
        before = lisp.eval("*lo-progress*")[0]
        time.sleep(0.5)
        assert lisp.eval("*lo-progress*")[0] != before
    finally:
        lisp.eval('(let ((beside (find "lo-beside" (sb-thread:list-all-threads) '
                  ':key (function sb-thread:thread-name) :test (function equal)))) '
                  '(when beside (sb-thread:terminate-thread beside)))')
        lisp.call("invoke-restart", restart="ABORT")


def test_lparallel_tasks_output_and_errors_reach_the_news(lisp):
    text, is_error = lisp.eval('(setf lparallel:*kernel* (lparallel:make-kernel 2 :name "lo-kernel"))')
    assert not is_error, text
    # The tasks write to the streams of the evaluation above, long ended.
    result = lisp.call("evaluate-lisp", code="""
(lparallel:pmap 'list (lambda (i)
                        (let ((out (format nil "task ~D out~%" i)) (err (format nil "task ~D err~%" i)))
                          (write-string out)
                          (write-string err *error-output*)
                          (incf (gethash :out *lo-written* 0) (length out))
                          (incf (gethash :err *lo-written* 0) (length err))
                          i))
                (loop for i below 40 collect i))""")
    assert not result["isError"], result
    notice = wait_for(lisp, "t", notice_of(result))
    for stream, key in (("stdout", ":out"), ("stderr", ":err")):
        text = news_text(lisp, notice, stream)
        written = "".join(line.split("] ", 1)[1] for line in text.splitlines(keepends=True)
                          if line.startswith("[lo-kernel"))
        count = int(lisp.eval(f"(gethash {key} *lo-written*)")[0].split()[1])
        assert len(written) == count, (stream, count, text)
        assert sorted(written.splitlines()) == sorted(f"task {i} {key[1:]}" for i in range(40))
    lisp.eval("(lparallel:end-kernel :wait t)")
