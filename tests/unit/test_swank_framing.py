"""Swank framing: 6 hex digits counting UTF-8 bytes, then the payload."""

import pytest
from hypothesis import given, strategies as st

from cl_mcp.errors import ProtocolError
from cl_mcp.lisp.swank.framing import MAX_PAYLOAD, FrameDecoder, encode_frame, parse_header


def test_length_counts_bytes_not_characters():
    # 3 characters, 9 bytes.
    frame = encode_frame("é€😀")
    assert frame[:6] == b"000009"
    assert frame[6:].decode("utf-8") == "é€😀"


def test_header_case_is_accepted_either_way():
    assert parse_header(b"0002DB") == parse_header(b"0002db") == 0x2DB


@pytest.mark.parametrize("header", [b"00002G", b"  0001", b"-00001", b"0001", b"+0001f", b"1_0000", b"0x0001"])
def test_bad_headers_are_protocol_errors(header):
    with pytest.raises(ProtocolError):
        parse_header(header)


def test_refuses_to_send_more_than_swank_accepts():
    with pytest.raises(ProtocolError):
        encode_frame("x" * (MAX_PAYLOAD + 1))
    assert len(encode_frame("é" * (MAX_PAYLOAD // 2))) == 6 + MAX_PAYLOAD - 1


def test_a_frame_over_64_kib():
    payload = '(:return (:ok "' + "λ" * 100_000 + '") 1)'
    decoder = FrameDecoder()
    decoder.feed(encode_frame(payload))
    assert decoder.next_payload() == payload
    assert decoder.pending == 0


def test_decoder_fed_byte_by_byte():
    frames = encode_frame("(:a)") + encode_frame('("é")')
    decoder = FrameDecoder()
    out = []
    for byte in frames:
        decoder.feed(bytes([byte]))
        while (payload := decoder.next_payload()) is not None:
            out.append(payload)
    assert out == ["(:a)", '("é")']


def test_invalid_utf8_payload_is_a_protocol_error():
    decoder = FrameDecoder()
    decoder.feed(b"000002\xc3\x28")
    with pytest.raises(ProtocolError):
        decoder.next_payload()


@given(st.lists(st.text(max_size=200), max_size=8), st.data())
def test_payloads_survive_any_chunking(payloads, data):
    stream = b"".join(encode_frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    out = []
    start = 0
    for cut in cuts + [len(stream)]:
        decoder.feed(stream[start:cut])
        start = cut
        while (payload := decoder.next_payload()) is not None:
            out.append(payload)
    assert out == payloads
