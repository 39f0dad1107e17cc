"""The [threads] notice made of the agent's news (cl_mcp/lisp/thread_news.py)."""

from __future__ import annotations

from cl_mcp.lisp.thread_news import NewsNotices, ThreadNews
from cl_mcp.wire.sexp import loads


def news(text: str) -> ThreadNews:
    return ThreadNews.from_plist(loads(text))


STOP = news('(:number 3 :stderr "[w] stopped at SIMPLE-ERROR: boom (evaluation 2)\n" '
            ':writers (("w" 6 1)) :stdout "[w] hi\n" '
            ':stops ((:thread "w" :id 7 :evaluation 2 :type "SIMPLE-ERROR" :message "boom\n  twice" '
            ':restarts (("CONTINUE" "Go on.") ("ABORT" "abort thread")))) :ends nil)')


def test_output_is_kept_under_its_number_and_shown_when_short():
    assert STOP.kept().stdout == "[w] hi\n" and STOP.number == 3
    notices = NewsNotices()
    notices.hear(STOP)
    text = notices.take()
    assert 'Output from threads since the last call: "w" 6 characters (1 line); read-output {"evaluation": 3}' in text
    assert "\n[w] hi\n" in text + "\n"
    assert notices.take() is None  # once


def test_a_stopped_threads_own_lines_are_kept_under_its_evaluation_number():
    mixed = news('(:number 5 :stderr "[w] stopped at SIMPLE-ERROR: boom (evaluation 2)\n[w]   0: (ERROR)\n'
                 '[ww] other\n[w]\n" :stdout "[w] hi\n[x] not w\n" :writers nil '
                 ':stops ((:thread "w" :evaluation 2 :type "SIMPLE-ERROR" :message "boom")) :ends nil)')
    kept = mixed.stopped_kept()
    assert list(kept) == [2]
    assert kept[2].stderr == "[w] stopped at SIMPLE-ERROR: boom (evaluation 2)\n[w]   0: (ERROR)\n[w]\n"
    assert kept[2].stdout == "[w] hi\n"


def test_a_stop_names_its_evaluation_restarts_and_one_line_message():
    notices = NewsNotices()
    notices.hear(STOP)
    text = notices.take()
    assert 'Thread "w" stopped at an error: SIMPLE-ERROR: boom twice\nIt waits as evaluation 2' in text
    assert "Restarts: 0 CONTINUE (Go on.); 1 ABORT (abort thread)." in text


def test_an_end_points_to_where_the_stop_was_kept():
    notices = NewsNotices()
    notices.hear(STOP)
    notices.take()
    notices.hear(news('(:writers nil :stops nil :ends ((:reason :timed-out :thread "w" :id 7 '
                      ':evaluation 2 :type "SIMPLE-ERROR" :message "boom")))'))
    assert notices.take() == (
        'Thread "w" (evaluation 2) was aborted at its error, SIMPLE-ERROR: boom, because it waited '
        'longer than --suspend-timeout. Its error and backtrace are kept: '
        'read-output {"evaluation": 3, "stream": "stderr"}.')


def test_no_news_no_notice():
    notices = NewsNotices()
    notices.hear(news("(:writers nil :stops nil :ends nil)"))
    assert notices.take() is None


def test_a_flood_of_notices_keeps_the_first_and_the_last():
    notices = NewsNotices()
    for number in range(1, 31):
        notices.hear(news(f'(:writers nil :stops ((:thread "t{number}" :evaluation {number} :type "E" '
                          ':message "m" :restarts nil)) :ends nil)'))
    assert len(notices.pending) == 20  # news between two results stays bounded
    text = notices.take()
    assert text.count("stopped at an error") == 20 and "(10 more notices left out)" in text
    assert 'Thread "t1" stopped' in text and 'Thread "t30" stopped' in text


def test_what_the_image_only_counted_is_said():
    notices = NewsNotices()
    notices.hear(news('(:number 9 :stderr "x" :writers nil :stops nil :ends nil :untold 7)'))
    assert notices.take().startswith("7 more threads stopped or were aborted at an error than are told here")


def test_a_thread_stopped_and_aborted_since_the_last_call_is_told_once():
    notices = NewsNotices()
    notices.hear(news('(:number 4 :stderr "x" :writers nil '
                      ':stops ((:thread "t" :evaluation 3 :type "E" :message "m" :restarts nil)) '
                      ':ends ((:reason :aborted :thread "t" :evaluation 3 :type "E" :message "m")))'))
    text = notices.take()
    assert "stopped at an error" not in text
    assert text.endswith('Its error and backtrace are kept: read-output {"evaluation": 4, "stream": "stderr"}.')
