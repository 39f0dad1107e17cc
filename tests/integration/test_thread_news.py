"""What the user's threads print and the errors they meet reach the model,
in an image cl-mcp owns and in a programmer's image it attaches to: their
output kept for read-output with each line marked by its thread, an error
no handler takes stopping its thread under an evaluation number, told in
the next tool result's [threads] notice, whatever tool that is; two at
once both wait and each goes on; past --max-suspended or
--suspend-timeout a thread is aborted and its error kept; a thread whose
own handler takes its error, and cl-mcp's own output, are left alone."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.integration.devtools import MODES, cl_mcp_in

NOTICE = re.compile(r"\n\n\[threads\]\n(.*)\Z", re.S)


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


def notice_of(result: dict) -> str:
    """The [threads] notice a result carries, or ''."""
    found = NOTICE.search(result["content"][0]["text"])
    return found.group(1) if found else ""


def notices_until(lisp, wanted: str, seen: str = "", within: float = 30) -> str:
    """SEEN and the [threads] notices of cheap calls, made until they
    mention WANTED, for WITHIN seconds (a thread on a loaded machine may
    take seconds to reach its error)."""
    deadline = time.monotonic() + within
    while wanted not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"no notice mentioned {wanted!r} within {within} s; seen: {seen}")
        seen += notice_of(lisp.call("threads", action="list")) + "\n"
        time.sleep(0.05)
    return seen


def start(lisp, code: str) -> str:
    """Evaluate CODE (which starts threads) to its end; the notices its
    results carry (answered "running" when a thread it started stopped at
    an error first, it is awaited)."""
    result = lisp.call("evaluate-lisp", code=code)
    assert not result["isError"], result
    notice = notice_of(result)
    if result["structuredContent"].get("running"):
        result = lisp.request("tools/call", {"name": "await-evaluation", "arguments": {
            "evaluation": result["structuredContent"]["number"], "wait": 30}})["result"]
        assert not result["isError"], result
        notice += notice_of(result)
    return notice


def waiting_evaluation(notice: str, thread: str) -> int:
    found = re.search(rf'Thread "{thread}" stopped at an error: .*\nIt waits as evaluation (\d+)', notice)
    assert found, notice
    return int(found.group(1))


def output_number(notice: str, thread: str) -> int:
    found = re.search(rf'Output from threads since the last call: [^\n]*"{thread}"[^\n]*'
                      r'read-output \{"evaluation": (\d+)\}', notice)
    assert found, notice
    return int(found.group(1))


def thread_entry(lisp, name: str) -> dict | None:
    threads = lisp.call("threads", action="list")["structuredContent"]["threads"]
    return next((t for t in threads if t["name"] == name), None)


def test_a_thread_that_prints_then_errs_is_seen_and_stops_where_the_tools_reach_it(lisp):
    notice = start(lisp, '(sb-thread:make-thread (lambda () (print :from-thread) (finish-output) '
                         '(sleep 0.2) (error "tn crash ~A" (+ 40 2))) :name "tn-crasher")')
    notice = notices_until(lisp, 'Thread "tn-crasher" stopped', notice)
    number = waiting_evaluation(notice, "tn-crasher")
    assert "SIMPLE-ERROR: tn crash 42" in notice, notice
    # The number backtrace and invoke-restart take reads its error too.
    own = lisp.call("read-output", evaluation=number, stream="stderr")
    assert not own["isError"], own
    assert f"[tn-crasher] stopped at SIMPLE-ERROR: tn crash 42 (evaluation {number})" \
        in own["content"][0]["text"], own
    output = lisp.call("read-output", evaluation=output_number(notice, "tn-crasher"))
    assert "[tn-crasher] :FROM-THREAD" in output["content"][0]["text"], output
    entry = thread_entry(lisp, "tn-crasher")
    assert (entry["state"], entry["evaluation"], entry["owner"]) == ("stopped-at-error", number, "user")
    frames = lisp.call("backtrace", evaluation=number)
    assert not frames["isError"] and "ERROR" in frames["content"][0]["text"], frames
    name = lisp.call("eval-in-frame", evaluation=number, frame=0,
                     code="(sb-thread:thread-name sb-thread:*current-thread*)")
    assert '"tn-crasher"' in name["content"][0]["text"], name
    # inspect reaches what eval-in-frame gave (*), as for any waiting evaluation.
    inspected = lisp.call("inspect", code="*")
    assert not inspected["isError"] and "tn-crasher" in inspected["content"][0]["text"], inspected
    ended = lisp.call("invoke-restart", evaluation=number, restart="ABORT")
    assert not ended["isError"], ended
    for _ in range(50):
        if thread_entry(lisp, "tn-crasher") is None:
            break
        time.sleep(0.05)
    assert thread_entry(lisp, "tn-crasher") is None


def test_an_error_while_no_call_runs_is_told_by_the_next_call_whatever_it_is(lisp, tmp_path):
    marker = tmp_path / "erring"
    # A handler that declines leaves a mark just before the error goes on to
    # the debugger; no call reaches the image meanwhile.
    start(lisp, f'''(sb-thread:make-thread
                    (lambda ()
                      (sleep 0.2)
                      (handler-bind ((error (lambda (c) (declare (ignore c))
                                              (with-open-file (f "{marker}" :direction :output)))))
                        (car (read-from-string "5"))))
                    :name "tn-later")''')
    for _ in range(200):
        if marker.exists():
            break
        time.sleep(0.02)
    time.sleep(1.0)  # from the mark to the stop: microseconds, on a quiet machine
    notice = notice_of(lisp.call("apropos", pattern="tn-no-such-name-anywhere"))
    number = waiting_evaluation(notice, "tn-later")
    assert "TYPE-ERROR" in notice, notice
    lisp.call("invoke-restart", evaluation=number, restart="ABORT")


def test_two_threads_that_err_at_once_both_wait_and_each_goes_on(lisp):
    started = start(lisp, """
      (let ((gate (sb-thread:make-semaphore)))
        (dolist (name '("tn-one" "tn-two"))
          (sb-thread:make-thread
           (lambda ()
             (sb-thread:wait-on-semaphore gate)
             (restart-case (error "tn both ~A" (sb-thread:thread-name sb-thread:*current-thread*))
               (continue () :report "Go on past the error."
                 (format t "went on~%"))))
           :name name))
        (sb-thread:signal-semaphore gate 2))""")
    notice = notices_until(lisp, 'Thread "tn-two" stopped', notices_until(lisp, 'Thread "tn-one" stopped', started))
    numbers = {name: waiting_evaluation(notice, name) for name in ("tn-one", "tn-two")}
    assert len(set(numbers.values())) == 2, numbers
    assert "0 CONTINUE (Go on past the error.)" in notice, notice
    later = ""
    for name, number in numbers.items():
        went = lisp.call("invoke-restart", evaluation=number, restart="CONTINUE")
        assert not went["isError"], went
        assert f'thread "{name}" left its error and runs on' in went["content"][0]["text"], went
        later += notice_of(went)
    for name in ("tn-one", "tn-two"):
        later = notices_until(lisp, f'"{name}"', later)
    texts = [lisp.call("read-output", evaluation=int(number))["content"][0]["text"]
             for number in re.findall(r'read-output \{"evaluation": (\d+)\}', later)]
    for name in ("tn-one", "tn-two"):
        assert any(f"[{name}] went on" in text for text in texts), (later, texts)


def test_a_thread_whose_own_handler_takes_its_error_is_untouched(lisp):
    notice = start(lisp, '(sb-thread:join-thread (sb-thread:make-thread (lambda () '
                         '(handler-case (error "tn handled") (error (c) (format t "handled: ~A~%" c)))) '
                         ':name "tn-handled"))')
    notice = notices_until(lisp, "tn-handled", notice)
    assert "stopped" not in notice, notice
    text = lisp.call("read-output", evaluation=output_number(notice, "tn-handled"))["content"][0]["text"]
    assert "[tn-handled] handled: tn handled" in text, text


def test_cl_mcps_own_output_never_goes_to_the_threads(lisp):
    result = lisp.call("evaluate-lisp", code='(progn (print :own) (format *error-output* "own~%") '
                                             '(format *trace-output* "traced~%"))')
    assert notice_of(result) == "", result
    assert notice_of(lisp.call("threads", action="list")) == ""


def test_a_flood_of_erring_threads_stays_bounded(lisp):
    notice = start(lisp, '(dotimes (i 40) (sb-thread:make-thread (lambda () (error "tn flood")) '
                         ':name (format nil "tn-flood-~D" i)))')
    for _ in range(100):
        threads = lisp.call("threads", action="list")
        notice += notice_of(threads)
        names = [t["name"] for t in threads["structuredContent"]["threads"]]
        if sum(name.startswith("tn-flood-") for name in names) <= 8:
            break
        time.sleep(0.05)
    stopped = [t for t in threads["structuredContent"]["threads"] if t["name"].startswith("tn-flood-")]
    assert len(stopped) <= 8 and all(t["state"] == "stopped-at-error" for t in stopped), stopped
    assert "was aborted at its error, SIMPLE-ERROR: tn flood" in notice
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)
    for thread in stopped:
        lisp.call("invoke-restart", evaluation=thread["evaluation"], restart="ABORT")


@pytest.mark.parametrize("mode", MODES)
def test_past_the_limits_a_stopped_thread_is_aborted_and_its_error_kept(mode):
    with cl_mcp_in(mode, "--max-suspended", "1", "--suspend-timeout", "1") as lisp:
        first = notices_until(lisp, 'Thread "tn-first" stopped', start(
            lisp, '(sb-thread:make-thread (lambda () (error "tn first")) :name "tn-first")'))
        # A second waiting thread makes room by aborting the first.
        seen = notices_until(lisp, 'Thread "tn-first" (evaluation', first + start(
            lisp, '(sb-thread:make-thread (lambda () (error "tn second")) :name "tn-second")'))
        assert re.search(r'Thread "tn-first" \(evaluation \d+\) was aborted at its error, '
                         r"SIMPLE-ERROR: tn first, because more stopped threads waited", seen), seen
        kept = re.search(r'Its error and backtrace are kept: read-output (\{[^}]*\})', seen)
        assert kept, seen
        # The second waits past --suspend-timeout.
        seen = notices_until(lisp, 'Thread "tn-second" (evaluation', seen)
        assert re.search(r'"tn-second" \(evaluation \d+\) was aborted at its error, SIMPLE-ERROR: '
                         r"tn second, because it waited longer than --suspend-timeout", seen), seen
        number = int(re.search(r'"evaluation": (\d+)', kept.group(1)).group(1))
        stderr = lisp.call("read-output", evaluation=number, stream="stderr")["content"][0]["text"]
        assert "[tn-first] stopped at SIMPLE-ERROR: tn first" in stderr, stderr
        assert thread_entry(lisp, "tn-first") is None


def test_a_thread_stopped_by_an_interrupt_counts_toward_the_limit_as_one_at_its_error():
    """Both are the user's threads stopped: one limit holds for the two."""
    with cl_mcp_in("embedded", "--max-suspended", "1") as lisp:
        text, is_error = lisp.eval('(sb-thread:make-thread (lambda () (loop (sleep 0.01))) :name "tn-napper")')
        assert not is_error, text
        napper = None
        while not napper:  # a thread just made gets its Linux id when it starts
            napper = next((t["id"] for t in lisp.call("threads", action="list")["structuredContent"]["threads"]
                           if t["name"] == "tn-napper"), None)
        stopped = lisp.call("threads", action="interrupt", thread=napper)
        assert not stopped["isError"], stopped
        notices_until(lisp, 'Thread "tn-after" stopped', start(
            lisp, '(sb-thread:make-thread (lambda () (error "tn after")) :name "tn-after")'))
        # The interrupted thread was let go, back to its work.
        text, is_error = lisp.eval("(mapcar #'cl-mcp-agent::evaluation-code cl-mcp-agent::*suspended*)")
        assert (text, is_error) == ("=> (:THREAD-ERROR)", False)
        assert thread_entry(lisp, "tn-napper")["state"] != "stopped-at-error", thread_entry(lisp, "tn-napper")


@pytest.mark.parametrize("mode", MODES)
def test_stopped_threads_never_push_out_nor_stand_in_for_the_models_evaluations(mode):
    with cl_mcp_in(mode, "--max-suspended", "1") as lisp:
        text = lisp.call("evaluate-lisp", code='(error "tn mine")')["content"][0]["text"]
        mine = int(re.search(r"Evaluation (\d+) is waiting", text).group(1))
        notice = notices_until(lisp, 'Thread "tn-worker" stopped', start(
            lisp, '(sb-thread:make-thread (lambda () (error "tn worker fails")) :name "tn-worker")'))
        worker = waiting_evaluation(notice, "tn-worker")
        # The model's evaluation still waits, and is the one a call without
        # a number reaches.
        where = lisp.call("eval-in-frame", frame=0, code="(sb-thread:thread-name sb-thread:*current-thread*)")
        assert not where["isError"] and "tn-worker" not in where["content"][0]["text"], where
        aborted = lisp.call("invoke-restart", evaluation=mine, restart="ABORT")
        assert aborted["content"][0]["text"].startswith("The evaluation was aborted."), aborted
        unnamed = lisp.call("invoke-restart", restart="ABORT")
        assert unnamed["isError"], unnamed
        assert f"wait as evaluations {worker}: name one" in unnamed["content"][0]["text"], unnamed
        # Aborting the stopped thread answers so, and the thread ends.
        ended = lisp.call("invoke-restart", evaluation=worker, restart="ABORT")
        assert ended["content"][0]["text"].startswith("The evaluation was aborted."), ended
        for _ in range(50):
            if thread_entry(lisp, "tn-worker") is None:
                break
            time.sleep(0.05)
        assert thread_entry(lisp, "tn-worker") is None


@pytest.mark.parametrize("limits", [{}, {"timeout": 120}], ids=["deadline-first", "window-first"])
def test_an_evaluation_waiting_on_a_thread_that_stopped_answers_at_once(lisp, limits):
    """It used to wait silently until its deadline (30 s by default) or its
    answer window (45 s) closed."""
    started = time.monotonic()
    result = lisp.call("evaluate-lisp", code='(sb-thread:join-thread (sb-thread:make-thread '
                                             '(lambda () (error "tn joined fails")) :name "tn-joined"))',
                       **limits)
    assert time.monotonic() - started < 20, result
    text = result["content"][0]["text"]
    assert not result["isError"] and result["structuredContent"]["running"], result
    number = result["structuredContent"]["number"]
    assert text.startswith(f"[running] Evaluation {number} "), text
    stopped = waiting_evaluation(notice_of(result), "tn-joined")
    assert "SIMPLE-ERROR: tn joined fails" in notice_of(result), text
    lisp.call("invoke-restart", evaluation=stopped, restart="ABORT")
    lisp.call("await-evaluation", evaluation=number, abort=True)


SERVER = """
(defvar *tn-listener*
  (let ((socket (make-instance 'sb-bsd-sockets:inet-socket :type :stream :protocol :tcp)))
    (sb-bsd-sockets:socket-bind socket #(127 0 0 1) 0)
    (sb-bsd-sockets:socket-listen socket 5)
    socket))
(sb-thread:make-thread
  (lambda ()
    (loop (let ((client (sb-bsd-sockets:socket-accept *tn-listener*)))
            (sb-thread:make-thread (lambda () (error "tn handler fails for ~A" client))
                                   :name "tn-handler"))))
  :name "tn-acceptor")
"""

ASK_SERVER = """
(let ((socket (make-instance 'sb-bsd-sockets:inet-socket :type :stream :protocol :tcp)))
  (sb-bsd-sockets:socket-connect socket #(127 0 0 1)
                                 (nth-value 1 (sb-bsd-sockets:socket-name *tn-listener*)))
  (read-byte (sb-bsd-sockets:socket-make-stream socket :input t :element-type '(unsigned-byte 8))))
"""


STOP_SERVER = """
(let ((acceptor (find "tn-acceptor" (sb-thread:list-all-threads) :key #'sb-thread:thread-name :test #'equal)))
  (sb-thread:terminate-thread acceptor)
  (sb-thread:join-thread acceptor :default nil)
  (sb-bsd-sockets:socket-close *tn-listener*)
  (makunbound '*tn-listener*))
"""


def test_a_call_waiting_on_a_server_in_the_image_answers_once_its_handler_stops(lisp):
    """The server was started by an earlier evaluation, as a hunchentoot
    acceptor is, and its handler stops at its error while this call reads
    from it (a drakma request waited its whole window, 20 s, in the trial):
    the call answers "still running" at once, telling of the stop, well
    before its answer window closes."""
    text, is_error = lisp.eval(SERVER)
    assert not is_error, text
    result = lisp.call("evaluate-lisp", code=ASK_SERVER, **{"answer-within": 20})
    text = result["content"][0]["text"]
    number = result["structuredContent"]["number"]
    try:
        assert result["structuredContent"].get("running"), result
        assert float(re.search(r"still running \((\d+\.\d) s so far\)", text).group(1)) < 10, text
        handler = waiting_evaluation(notice_of(result), "tn-handler")
        lisp.call("invoke-restart", evaluation=handler, restart="ABORT")
    finally:
        lisp.call("await-evaluation", evaluation=number, abort=True)
        # The acceptor is ended before its socket closes: left blocked on a
        # closed descriptor, it woke later at an error of its own, and that
        # stop hurried the next test's call (answered "still running", 0.0 s).
        text, is_error = lisp.eval(STOP_SERVER)
        assert not is_error, text


def test_a_call_that_cannot_be_answered_yet_tells_of_the_stop_in_its_progress_and_the_log(lisp):
    """Its code blocks interrupts, so its answer waits: for 3 s once the
    thread is recorded stopped (a first backtrace can take seconds on a
    loaded machine). Its progress messages meanwhile name the stopped
    thread, and the log (stderr, and notifications/message) says so too."""
    token = f"tn-progress-{lisp.mode}"
    request = lisp.start_request("tools/call", {
        "name": "evaluate-lisp", "_meta": {"progressToken": token},
        "arguments": {"code": '(progn (sb-sys:without-interrupts '
                              '(sb-thread:make-thread (lambda () (error "tn blocked beside")) :name "tn-beside") '
                              "(loop until (find \"tn-beside\" cl-mcp-agent::*suspended* :test (function equal) "
                              ":key (lambda (e) (sb-thread:thread-name (cl-mcp-agent::evaluation-thread e)))) "
                              "do (sleep 0.05)) "
                              "(sleep 3)) :done)"}})
    result = lisp.response(request)["result"]
    messages = [json.loads(line) for line in list(lisp.raw_lines)]
    told = [m["params"]["message"] for m in messages if m.get("method") == "notifications/progress"
            and m["params"]["progressToken"] == token and "tn-beside" in m["params"]["message"]]
    assert told, (result, [m for m in messages if m.get("method") == "notifications/progress"][-3:])
    assert 'thread "tn-beside" stopped at an error, SIMPLE-ERROR: tn blocked beside' in told[0], told
    logged = [m["params"]["data"] for m in messages if m.get("method") == "notifications/message"]
    assert any('thread "tn-beside" stopped' in data for data in logged), logged
    assert any('thread "tn-beside" stopped' in line for line in lisp.stderr_lines)
    notice = notice_of(result) or notices_until(lisp, 'Thread "tn-beside" stopped')
    lisp.call("invoke-restart", evaluation=waiting_evaluation(notice, "tn-beside"), restart="ABORT")
    if result["structuredContent"].get("running"):
        lisp.call("await-evaluation", evaluation=result["structuredContent"]["number"], abort=True)


def test_a_thread_that_stops_while_no_call_runs_is_logged_at_once(lisp):
    text, is_error = lisp.eval('(sb-thread:make-thread (lambda () (sleep 0.3) (error "tn idle fails")) '
                               ':name "tn-idle")')
    assert not is_error, text
    deadline = time.monotonic() + 30  # no call is made meanwhile
    while not any('thread "tn-idle" stopped' in line for line in lisp.stderr_lines):
        assert time.monotonic() < deadline, "the stop was never logged"
        time.sleep(0.05)
    notice = notices_until(lisp, 'Thread "tn-idle" stopped')
    # Sent whole, and nothing written for the sending (Swank's error, say).
    assert "Output from threads" not in notice, notice
    lisp.call("invoke-restart", evaluation=waiting_evaluation(notice, "tn-idle"), restart="ABORT")


def test_an_evaluation_whose_forms_have_returned_answers_their_value_whatever_stops_beside_it(lisp):
    """A thread it started that stops once the forms have returned must not
    turn the answer into "still running" (issue 44, item 14: 2 of 5 calls
    did).  To land the stop in that instant every time, the agent's
    keep-value, which runs after the last form returns, is made slow."""
    slow = lisp.call("evaluate-lisp", code="(sb-int:encapsulate 'cl-mcp-agent::keep-value 'tn-slow "
                                           "(lambda (f &rest args) (sleep 1) (apply f args)))")
    assert not slow["isError"], slow
    try:
        result = lisp.call("evaluate-lisp", code='(progn (sb-thread:make-thread (lambda () (sleep 0.2) '
                                                 '(error "tn after the value")) :name "tn-late") '
                                                 ':tn-returned)')
    finally:
        lisp.call("evaluate-lisp", code="(sb-int:unencapsulate 'cl-mcp-agent::keep-value 'tn-slow)")
    assert not result["isError"], result
    assert not result["structuredContent"].get("running"), result
    assert result["structuredContent"]["values"] == [":TN-RETURNED"], result
    notice = notices_until(lisp, "tn-late", notice_of(result))
    lisp.call("invoke-restart", evaluation=waiting_evaluation(notice, "tn-late"), restart="ABORT")
