"""Output written to an evaluation's stream after that evaluation ended
reaches the model in the threads' news ([threads] notice, read-output),
checked against the writer's own count of what it wrote: a plain thread
that kept the evaluation's *standard-output*, and lparallel's workers
(Debian's, from the corpus), whose kernel binds the *standard-output* and
*error-output* of the evaluation that made it."""

from __future__ import annotations

import re

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
    """What THREAD's lines of the threads' output say, its marks taken off."""
    mark = f"[{thread}] "
    return "".join(line[len(mark):] for line in text.splitlines(keepends=True) if line.startswith(mark))


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
