"""The lane: the session's requests take a second, single-threaded Swank
connection in an image cl-mcp owns, and an evaluation that must wait at an
error hands the lane to a fresh thread."""

import asyncio
import socket

import pytest

from cl_mcp.lisp.config import ImageConfig, SessionConfig
from cl_mcp.lisp.image import LispImage
from cl_mcp.lisp.session import LispSession
from cl_mcp.lisp.swank import connection as swank_connection
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.lisp.swank.framing import encode_frame
from cl_mcp.wire import idle_poll
from cl_mcp.wire.sexp import Symbol
from tests.integration.conftest import McpProcess
from tests.polling import all_cpus, one_cpu, several_cpus

# The name and address of the thread an evaluation runs in.
THREAD = ('(let ((thread sb-thread:*current-thread*)) '
          '(format nil "~A ~X" (sb-thread:thread-name thread) (sb-kernel:get-lisp-obj-address thread)))')


def test_evaluations_take_the_lane(server):
    first, is_error = server.eval(THREAD)
    assert not is_error and 'cl-mcp lane' in first
    assert server.eval(THREAD) == (first, False)  # the same thread, call after call


def test_an_evaluation_waiting_at_an_error_hands_the_lane_on(server):
    before, _ = server.eval(THREAD)
    text, is_error = server.eval('(error "stop here")')
    assert is_error and "[Restarts]" in text  # it waits there
    after, _ = server.eval(THREAD)
    assert "cl-mcp lane" in after and after != before
    assert server.call("invoke-restart", restart="ABORT")["isError"] is False
    assert server.eval("(+ 1 2)") == ("=> 3", False)


def test_a_lane_thread_made_inside_a_deadlines_interrupt_hears_its_own_deadline(server):
    """A timeout waits at its error inside the deadline's interrupt, and
    hands the lane on from there, where SBCL blocks the signals that carry
    interrupts; the next thread must not inherit that."""
    for _ in range(2):
        text, is_error = server.eval("(loop)", timeout=1)
        assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    assert server.eval("(+ 1 2)") == ("=> 3", False)


def test_a_thread_ended_by_its_own_code_leaves_the_lane_served(server):
    text, is_error = server.eval("(sb-thread:abort-thread)")
    assert is_error and "CL-MCP:ABORTED" in text
    assert server.eval("(+ 1 2)") == ("=> 3", False)


def test_the_lane_keeps_no_printed_copies_of_its_requests_and_results(server):
    """Swank prints each event into its event history, a ring of the last
    40; on the lane that would keep up to 40 printed results alive."""
    assert server.eval('(make-string 3 :initial-element #\\Q) "marker-in-the-code"')[1] is False
    text, is_error = server.eval(
        '(count-if (lambda (entry) (and (stringp entry) (or (search "QQQ" entry) '
        '(search "marker-in-the-code" entry)))) swank::*event-history*)')
    assert (text, is_error) == ("=> 0", False)
    # Swank's own connection still keeps its history, as shipped: cl-mcp
    # asked for the lane there.
    text, is_error = server.eval(
        '(plusp (count-if (lambda (entry) (and (stringp entry) (search "OPEN-LANE" entry '
        ':test (function char-equal)))) swank::*event-history*))')
    assert (text, is_error) == ("=> T", False)


def test_the_lane_takes_one_connection_and_only_with_the_secret():
    """A stranger is closed on; cl-mcp gets the lane; then nobody else."""
    async def body():
        image = LispImage(ImageConfig())
        port = await image.start()
        control = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
        try:
            name = await control.rex([Symbol("cl-mcp-agent:open-lane")])
            address = "\0" + name  # an abstract Unix-domain socket
            stranger = socket.socket(socket.AF_UNIX)
            stranger.settimeout(5)
            stranger.connect(address)
            stranger.sendall(encode_frame("not the secret"))
            assert stranger.recv(100) == b""  # closed on it
            stranger.close()
            # The listener waits on for cl-mcp (see test_squatters.py) ...
            lane = await SwankConnection.open(address, None, secret=image.secret, ids=control.ids)
            assert await lane.rex([Symbol("cl:+"), 2, 2]) == 4
            await lane.close()
            await asyncio.sleep(0.5)
            with socket.socket(socket.AF_UNIX) as late, pytest.raises(ConnectionRefusedError):
                late.connect(address)  # ... and closes once it has the lane
            # A second lane is another socket, and takes the secret.
            lane = await SwankConnection.open(
                "\0" + await control.rex([Symbol("cl-mcp-agent:open-lane")]), None,
                secret=image.secret, ids=control.ids)
            assert await lane.rex([Symbol("cl:+"), 2, 2]) == 4
            await lane.close()
            assert await control.rex([Symbol("cl:+"), 1, 2]) == 3
        finally:
            await control.close()
            await image.stop()
    asyncio.run(asyncio.wait_for(body(), 60))


# Runs the lane's idle poll on a pipe, with input there already, input that
# comes while it polls, and none at all: what it found and how long it took.
# No yield counts as late here (that is the back-off's test): on a busy
# machine one would end the poll early.
IDLE_POLL = """
(multiple-value-bind (in-fd out-fd) (sb-unix:unix-pipe)
  (let ((in (sb-sys:make-fd-stream in-fd :input t :element-type '(unsigned-byte 8)))
        (out (sb-sys:make-fd-stream out-fd :output t :element-type '(unsigned-byte 8)))
        (cl-mcp-agent::*lane-quiet-until* 0)
        (cl-mcp-agent::*lane-poll-stolen-microseconds* most-positive-fixnum))
    (unwind-protect
         (flet ((poll (microseconds)
                  (let ((cl-mcp-agent::*lane-idle-poll-microseconds* microseconds)
                        (started (cl-mcp-agent::monotonic-microseconds)))
                    (format nil "~:[no~;yes~] ~D" (cl-mcp-agent::input-soon-p in)
                            (- (cl-mcp-agent::monotonic-microseconds) started)))))
           (let ((none (poll 50000)))
             (write-byte 1 out) (finish-output out)
             (let ((already (poll 30000000)))
               (read-byte in)
               (let ((writer (sb-thread:make-thread
                              (lambda () (sleep 0.01) (write-byte 2 out) (finish-output out)))))
                 (prog1 (format nil "~A ~A ~A" already (poll 30000000) none)
                   (sb-thread:join-thread writer))))))
      (close in) (close out))))
"""


def test_the_lane_polls_for_its_next_request_before_it_sleeps(shared_server):
    text, is_error = shared_server.eval(IDLE_POLL)
    assert not is_error, text
    already, _, during, waited, none, looked = text.removeprefix('=> "').rstrip('"').split()
    assert (already, during, none) == ("yes", "yes", "no")
    assert int(waited) < 1_000_000  # it took the input when it came (after 10 ms), not at the poll's end
    assert int(looked) >= 50_000  # with nothing coming, it looked for the whole poll


# The smallest step of the clock that times the poll, in microseconds.
CLOCK_STEP = """
(loop repeat 5
      minimize (loop with start = (cl-mcp-agent::monotonic-microseconds)
                     for now = (cl-mcp-agent::monotonic-microseconds)
                     unless (= now start) return (- now start)))
"""


def test_the_lanes_poll_is_timed_by_a_fine_clock(shared_server):
    """SBCL's get-internal-real-time moves in scheduler ticks: a 0.3 ms poll
    timed by it lasted up to 4 ms."""
    text, is_error = shared_server.eval(CLOCK_STEP)
    assert not is_error, text
    assert int(text.removeprefix("=> ")) < 1000


@pytest.mark.parametrize("cpus", [all_cpus, one_cpu], ids=["all CPUs", "one CPU"])
def test_the_lane_polls_only_where_that_pays(cpus):
    with cpus():
        process = McpProcess()
        expected = "=> 300" if several_cpus() else "=> 0"
    try:
        process.initialize()
        assert process.eval("cl-mcp-agent::*lane-idle-poll-microseconds*") == (expected, False)
    finally:
        process.close()


@pytest.mark.parametrize("cpus", [all_cpus, one_cpu], ids=["all CPUs", "one CPU"])
def test_cl_mcp_polls_for_the_lanes_answers_only_where_that_pays(monkeypatch, cpus):
    spins = []
    read_soon = swank_connection._read_soon

    def recording(fd, spin, window):
        spins.append(spin)
        return read_soon(fd, spin, window)

    monkeypatch.setattr(swank_connection, "_read_soon", recording)

    async def body():
        session = LispSession(SessionConfig())
        try:
            lane, control = await session._link.connections()
            assert lane is not control
            assert await lane.rex([Symbol("cl:+"), 1, 2]) == 3
        finally:
            await session.close()

    with cpus():
        asyncio.run(asyncio.wait_for(body(), 60))
        expected = idle_poll.IDLE_SPIN if several_cpus() else 0.0
    assert spins and set(spins) == {expected}


# A lane poll whose yields all count as late, then one in the quiet that follows.
BACK_OFF = """
(multiple-value-bind (in-fd out-fd) (sb-unix:unix-pipe)
  (let ((in (sb-sys:make-fd-stream in-fd :input t :element-type '(unsigned-byte 8)))
        (cl-mcp-agent::*lane-quiet-until* 0))
    (unwind-protect
         (flet ((poll ()
                  (let ((cl-mcp-agent::*lane-idle-poll-microseconds* 50000)
                        (started (cl-mcp-agent::monotonic-microseconds)))
                    (cl-mcp-agent::input-soon-p in)
                    (- (cl-mcp-agent::monotonic-microseconds) started))))
           (let ((late (let ((cl-mcp-agent::*lane-poll-stolen-microseconds* 0)) (poll)))
                 (quiet-for (- cl-mcp-agent::*lane-quiet-until* (cl-mcp-agent::monotonic-microseconds)))
                 (in-quiet (poll)))
             (format nil "~D ~D ~D" late quiet-for in-quiet)))
      (close in) (sb-unix:unix-close out-fd))))
"""


def test_a_late_yield_stops_the_lanes_polling_for_a_while(shared_server):
    text, is_error = shared_server.eval(BACK_OFF)
    assert not is_error, text
    late, quiet_for, in_quiet = map(int, text.removeprefix('=> "').rstrip('"').split())
    assert late < 50_000  # it stopped at the first late yield, not after the 50 ms poll
    assert quiet_for > 500_000  # and will not poll for about a second
    assert in_quiet < 50_000  # nor did it, then


# Three waits for input that comes 100 ms later, then one for input already
# there: the CPU this thread spent in each wait, and the long waits counted.
LONG_WAITS = """
(multiple-value-bind (in-fd out-fd) (sb-unix:unix-pipe)
  (let ((in (sb-sys:make-fd-stream in-fd :input t :element-type '(unsigned-byte 8)))
        (out (sb-sys:make-fd-stream out-fd :output t :element-type '(unsigned-byte 8)))
        (cl-mcp-agent::*lane-idle-poll-microseconds* 50000)
        (cl-mcp-agent::*lane-poll-stolen-microseconds* most-positive-fixnum)
        (cl-mcp-agent::*lane-quiet-until* 0)
        (cl-mcp-agent::*lane-long-waits* 0))
    (unwind-protect
         (flet ((wait (delay)
                  (let ((writer (sb-thread:make-thread
                                 (lambda () (sleep delay) (write-byte 1 out) (finish-output out))))
                        (cpu (multiple-value-bind (s ns) (sb-unix::clock-gettime 3) (+ (* s 1000000) (floor ns 1000)))))
                    (cl-mcp-agent::wait-for-request in in-fd)
                    (read-byte in)
                    (sb-thread:join-thread writer)
                    (list (- (multiple-value-bind (s ns) (sb-unix::clock-gettime 3) (+ (* s 1000000) (floor ns 1000))) cpu)
                          cl-mcp-agent::*lane-long-waits*))))
           (format nil "~{~{~D ~D~}~^ ~}" (list (wait 0.1) (wait 0.1) (wait 0.1) (wait 0))))
      (close in) (close out))))
"""


def test_the_lane_sleeps_at_once_after_long_waits(shared_server):
    """An assistant's requests come seconds apart: a poll after each reply
    spun to its end for nothing (≈0.3 ms of the image's CPU per call).
    After two waits that outlasted the poll the lane sleeps at once, until
    a request comes within the poll again."""
    text, is_error = shared_server.eval(LONG_WAITS)
    assert not is_error, text
    _, long1, _, long2, cpu3, long3, _, long4 = map(int, text.removeprefix('=> "').rstrip('"').split())
    assert (long1, long2, long3, long4) == (1, 2, 2, 0)
    assert cpu3 < 10_000  # the third slept at once, where a poll would have spun for 50 ms


def test_the_image_takes_the_whole_polling_policy_from_idle_poll(shared_server):
    """One definition (idle_poll.py): the image is sent its values."""
    text, is_error = shared_server.eval(
        "(list cl-mcp-agent::*lane-poll-stolen-microseconds* cl-mcp-agent::*lane-poll-back-off-microseconds*)")
    assert (text, is_error) == (
        f"=> ({round(idle_poll.STOLEN * 1e6)} {round(idle_poll.BACK_OFF * 1e6)})", False)
