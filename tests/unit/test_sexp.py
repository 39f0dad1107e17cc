"""The s-expression codec, alone: examples from the Swank notes and round trips."""

from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from cl_mcp import sexp
from cl_mcp.errors import ProtocolError
from cl_mcp.sexp import Character, Keyword, Symbol, Unreadable


def test_writes_a_request_as_swank_expects():
    form = [Keyword("emacs-rex"), [Symbol("swank:connection-info")], "COMMON-LISP-USER", True, 1]
    assert sexp.dumps(form) == '(:emacs-rex (swank:connection-info) "COMMON-LISP-USER" t 1)'


def test_strings_escape_only_backslash_and_quote():
    assert sexp.dumps('a"b\\c\nd\te') == '"a\\"b\\\\c\nd\te"'
    assert sexp.loads('"a\\"b\\\\c\nd"') == 'a"b\\c\nd'


def test_a_backslash_before_another_character_yields_that_character():
    # Lisp has no \n escape: "a\nb" with a real backslash reads as "anb".
    assert sexp.loads('"a\\nb"') == "anb"


def test_atoms():
    assert sexp.loads("nil") == []
    assert sexp.loads("()") == []
    assert sexp.loads("t") is True
    assert sexp.loads(":ok") == Keyword("ok")
    assert sexp.loads("common-lisp-user::foo") == Symbol("common-lisp-user::foo")
    assert sexp.loads("-42") == -42
    assert sexp.loads("123456789012345678901234567890") == 123456789012345678901234567890
    assert sexp.loads("1/3") == Fraction(1, 3)
    assert sexp.loads("1.5") == 1.5
    assert sexp.loads("1.0e10") == 1.0e10
    assert sexp.loads("1.5e-7") == 1.5e-7
    assert sexp.loads("1.5d0") == 1.5


def test_floats_are_written_as_double_floats():
    assert sexp.dumps(1.5) == "1.5d0"
    assert sexp.dumps(1e300) == "1.0d+300"
    assert sexp.dumps(30.0) == "30.0d0"


def test_reads_the_unreadable_syntax_swank_may_send():
    text = ('(:return (:ok ("tab\tnul\x00" common-lisp-user::|Foo bar| 1.5 1/3 #\\a '
            '#<common-lisp:hash-table :TEST common-lisp:eql :COUNT 0 {1001C198C3}> '
            ':key nil t #(1 2))) 3)')
    value = sexp.loads(text)
    status, body = value[1]
    assert status == Keyword("ok")
    assert body[0] == "tab\tnul\x00"
    assert body[1] == Symbol("common-lisp-user::|Foo bar|")
    assert body[4] == Character("a")
    assert isinstance(body[5], Unreadable) and body[5].text.startswith("#<common-lisp:hash-table")
    assert body[-1] == (1, 2)


def test_characters_that_are_delimiters():
    assert sexp.loads("(#\\( #\\) #\\Space)") == [Character("("), Character(")"), Character("Space")]


def test_plist():
    assert sexp.plist(sexp.loads('(:a 1 :b "x")')) == {"a": 1, "b": "x"}
    with pytest.raises(ProtocolError):
        sexp.plist(sexp.loads("(:a)"))


@pytest.mark.parametrize("text", ["", "(", "(1 2", '"abc', ")", "(1 . 2)", "1 2", "#", "#<abc"])
def test_malformed_input_is_a_protocol_error(text):
    with pytest.raises(ProtocolError):
        sexp.loads(text)


atoms = st.one_of(
    st.text(),
    st.integers(),
    st.fractions().filter(lambda f: f.denominator != 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans().map(lambda b: True),
    st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True).map(Keyword),
    st.from_regex(r"[a-z][a-z0-9-]{0,8}:[a-z][a-z0-9%*+-]{0,10}", fullmatch=True).map(Symbol),
)
values = st.recursive(atoms, lambda inner: st.lists(inner, min_size=1, max_size=5), max_leaves=30)


@given(values)
def test_round_trip(value):
    assert sexp.loads(sexp.dumps(value)) == value


@given(st.text())
def test_strings_round_trip_through_utf8_bytes(text):
    encoded = sexp.dumps(text).encode("utf-8")
    assert sexp.loads(encoded.decode("utf-8")) == text


@given(st.text(alphabet=st.sampled_from('()"\\#<>|:;\' abc1.\n'), max_size=40))
def test_garbage_only_ever_raises_protocol_error(text):
    try:
        sexp.loads(text)
    except ProtocolError:
        pass


def _outcome(read, text):
    try:
        return ("value", read(text))
    except ProtocolError:
        return ("error", None)


@given(st.one_of(values.map(sexp.dumps),
                 st.text(alphabet=st.sampled_from('()"\\#<>|:;\' abc1.\n\t-/\xa0\x0b\x85λ'), max_size=40)))
def test_the_fast_path_reads_exactly_what_the_general_reader_reads(text):
    assert _outcome(sexp.loads, text) == _outcome(sexp._loads_any, text)


def test_a_multi_megabyte_string_with_escapes_reads_in_linear_time():
    text = 'x\\"y' * 1_000_000  # 4 MB, a million escaped quotes
    assert sexp.loads(sexp.dumps(["big", text])) == ["big", text]


def test_a_ratio_with_a_zero_denominator_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        sexp.loads("(1 0/0)")


def test_strings_with_escapes_read_in_every_position():
    assert sexp.loads(r'("a\"b" "c\\" "\\\"" x "\d")') == ['a"b', "c\\", '\\"', Symbol("x"), "d"]
    assert sexp.loads('"\\\\\0"') == "\\\0"  # a NUL beside an escape
