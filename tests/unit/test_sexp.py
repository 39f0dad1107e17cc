"""The s-expression codec, alone: examples from the Swank notes and round trips."""

from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from cl_mcp.errors import ProtocolError
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Character, Keyword, Symbol, Unreadable


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


@pytest.mark.parametrize("text", ["", "(", "(1 2", '"abc', ")", "(1 . 2)", "(1 .)", "(. 1)", ".",
                                  "(1 .\f2)", "1 2", "#", "#<abc"])
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


# ---------------------------------------------------------------- two readers
#
# `loads` tries a fast path (`_loads_plain`) before the general reader
# (`_loads_any`); bench/pure.py measures what that saves.  Two readers are
# only safe when proven equal: the fast path must accept every reply as the
# image writes it and read the same value, and on any other text it must
# either decline (leaving it to the general reader) or read the same value,
# never accepting what the general reader rejects.


def _outcome(read, text):
    """("value", its repr) or ("rejected",).  The repr tells 1 from 1.0,
    True and Fraction(1), and -0.0 from 0.0, where == does not."""
    try:
        return ("value", repr(read(text)))
    except ProtocolError:
        return ("rejected",)


def _fast_path_outcome(text):
    """Its value's repr, or ("no value",) when it declines or rejects TEXT:
    either way loads hands TEXT to the general reader."""
    try:
        value = sexp._loads_plain(text)
    except (sexp._Uncommon, ProtocolError):
        return ("no value",)
    return ("value", repr(value))


def _float_text(value, marker):
    """VALUE as Lisp may print it: 1.5, 1.5d0, 1.0e10, 1.0d+300."""
    if not marker:
        return repr(value)
    mantissa, _, exponent = repr(value).partition("e")
    return f"{mantissa}{marker}{exponent or 0}"


def _lisp_escaped(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')


separators = st.sampled_from([" ", " ", " ", "  ", "\n", "\t", "\r\n", "\f", " \n  "])
blanks = st.sampled_from(["", "", "", " ", "\n", "\t "])
# A string's text: anything, escaped as Lisp writes it, and escapes Lisp
# reads but never writes (\n is "n", \λ is "λ").
strings = st.lists(st.text(max_size=8).map(_lisp_escaped)
                   | st.sampled_from(['\\"', "\\\\", "\\n", "\\a", "\\λ", '\\\\\\"', '\\"\\"']),
                   max_size=6).map(lambda parts: '"' + "".join(parts) + '"')
names = st.builds(str.__add__, st.sampled_from("aZq*%<>="),  # never a number
                  st.text(alphabet="abcXYZ019*+%<>=/.!?-", max_size=10))
packages = st.sampled_from(["swank", "COMMON-LISP-USER", "cl-mcp-agent", "SB-KERNEL"])
symbols = names | st.builds("{}{}{}".format, packages, st.sampled_from([":", "::"]), names)
keywords = names.map(":{}".format)
integers = st.one_of(st.integers().map(str), st.integers(-(2**200), 2**200).map(str),
                     st.sampled_from(["+7", "42.", "-0"]))
floats = st.builds(_float_text, st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(["", "d", "e", "f", "s", "l", "D", "E"]))
ratios = st.builds("{}/{}".format, st.integers(), st.integers(1, 10**30))
constants = st.sampled_from(["nil", "NIL", "()", "t", "T"])
plain_atoms = strings | symbols | keywords | integers | floats | ratios | constants
# What Swank may send and only the general reader reads.
uncommon_atoms = st.sampled_from([
    "#<HASH-TABLE :TEST EQL :COUNT 0 {1001C198C3}>", "#<a #<b> c>", "#\\a", "#\\(", "#\\Space",
    "#(1 2)", "'x", "'(1 2)", "|Foo bar|", "cl-user::|a b|", "λ", "cl-user::größe", "x\x0by", "\xa0"])


def _list_text(draw, elements):
    inside = "".join(element + draw(separators) for element in elements[:-1]) + "".join(elements[-1:])
    return "(" + draw(blanks) + inside + draw(blanks) + ")"


@st.composite
def lists_of(draw, items):
    return _list_text(draw, draw(st.lists(items, max_size=5)))


@st.composite
def plists_of(draw, values):
    pairs = draw(st.lists(st.tuples(keywords, separators, values), max_size=6))
    return _list_text(draw, ["".join(pair) for pair in pairs])


def replies_of(atoms):
    """Messages as Swank writes them to cl-mcp, with values made of ATOMS."""
    values = st.recursive(atoms, lists_of, max_leaves=15)
    ids = st.integers(1, 2**40).map(str)
    message = st.one_of(
        st.builds("(:return (:ok {}) {})".format, plists_of(values), ids),
        st.builds("(:return (:ok {}) {})".format, values, ids),
        st.builds("(:return (:abort {}) {})".format, strings, ids),
        st.builds("(:write-string {} :repl-result)".format, strings),
        st.builds("(:ping {} {})".format, ids, ids))
    return st.builds("{}{}{}".format, blanks, message, blanks)


replies = replies_of(plain_atoms)
uncommon_replies = replies_of(uncommon_atoms | plain_atoms)


@st.composite
def damaged(draw, texts):
    """TEXTS cut short, or with one character taken out or one piece put in."""
    text = draw(texts)
    at = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["cut", "take out", "put in"]))
    if how == "cut":
        return text[:at]
    if how == "take out":
        return text[:at] + text[at + 1:]
    piece = draw(st.sampled_from(['(', ')', '"', '\\', '#', '#<', '|', "'", ';', ' . ', ':', '1/0',
                                  '\xa0', '\x0b', '\x1c', 'λ', ' x', '"x"']))
    return text[:at] + piece + text[at:]


@settings(max_examples=500)
@given(replies)
def test_the_fast_path_reads_every_reply_as_the_general_reader_does(text):
    assert _fast_path_outcome(text) == _outcome(sexp._loads_any, text), text
    assert _fast_path_outcome(text)[0] == "value", text


@given(uncommon_replies)
def test_loads_reads_the_syntax_the_fast_path_declines(text):
    assert _outcome(sexp.loads, text) == _outcome(sexp._loads_any, text) != ("rejected",), text


@settings(max_examples=500)
@given(damaged(replies | uncommon_replies)
       | st.text(alphabet=st.sampled_from('()"\\#<>|:;\' abc1.\n\t-/\xa0\x0b\x85λ'), max_size=40))
def test_the_fast_path_never_reads_otherwise_or_what_the_general_reader_rejects(text):
    general = _outcome(sexp._loads_any, text)
    assert _fast_path_outcome(text) in (general, ("no value",)), text
    assert _outcome(sexp.loads, text) == general, text


def test_a_multi_megabyte_string_with_escapes_reads_in_linear_time():
    text = 'x\\"y' * 1_000_000  # 4 MB, a million escaped quotes
    assert sexp.loads(sexp.dumps(["big", text])) == ["big", text]


def test_a_ratio_with_a_zero_denominator_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        sexp.loads("(1 0/0)")


def test_strings_with_escapes_read_in_every_position():
    assert sexp.loads(r'("a\"b" "c\\" "\\\"" x "\d")') == ['a"b', "c\\", '\\"', Symbol("x"), "d"]
    assert sexp.loads('"\\\\\0"') == "\\\0"  # a NUL beside an escape
