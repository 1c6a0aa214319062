"""The grammar of an HTTP/1.1 response head (RFC 9112, RFC 9110 5), strictly: the status
line, the field lines, framing fields, chunk-size lines and trailer lines. http1.py applies
it to every answer; whatever breaks it is a GrammarError there (a MalformedError to callers).
"""

from __future__ import annotations

import re


class GrammarError(ValueError):
    """Bytes that break the grammar below; the message says where."""


# RFC 9112 4: HTTP-version SP 3DIGIT SP reason-phrase (the SP before an empty reason is
# optional here: many servers leave it out). Reason: HTAB, SP, VCHAR, obs-text.
STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [\t\x20-\x7e\x80-\xff]*)?")
# RFC 9110 5.1, 5.5: token ":" OWS field-value OWS CRLF, where the value starts and ends with
# a visible character and holds no control character but HTAB. Found in the decoded block of
# all field lines at once, each match anchored at a line start (one regex pass in C: the head
# of every answer goes through here); the block is well-formed when every line matched, that
# is when the matches, the CRLFs and the LFs are as many (a bare CR or LF, or a line that is
# not a field, leaves a line unmatched). A line that starts with whitespace (obs-fold) has no
# token before its colon and fails.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_VALUE = r"(?:[^\x00-\x20\x7f](?:[^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f])?)?"
_FIELD = re.compile(rf"^({_TOKEN}):[ \t]*({_VALUE})[ \t]*\r\n", re.MULTILINE)
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "content-type"})
TRAILER_LINE = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*[\t\x20-\x7e\x80-\xff]*"
)  # a trailer line (bytes; trailers are checked, then dropped)
_DIGITS = re.compile(r"[0-9]{1,18}")
# RFC 9112 7.1: chunk-size (hex digits) [ BWS ";" chunk-ext ], no whitespace before a CRLF.
CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:[ \t]*;[\t\x20-\x7e\x80-\xff]*)?")


def fields(
    block: str, version: bytes
) -> tuple[list[tuple[str, str]], int | None, bool, list[str], str]:
    """The field lines of one head (`block`, each line with its CRLF), strictly checked:
    (headers in order, Content-Length, chunked, Connection tokens, content type)."""
    headers: list[tuple[str, str]] = _FIELD.findall(block)
    lines = block.count("\r\n")
    if len(headers) != lines or block.count("\n") != lines:
        bad = next(
            (ln for ln in block.split("\r\n") if ln and not _FIELD.fullmatch(ln + "\r\n")),
            block,
        )
        raise GrammarError(f"malformed header line: {bad[:80]!r}")
    length: int | None = None
    chunked = False
    connection: list[str] = []
    content_type = ""
    for name, value in headers:
        lname = name.lower()
        if lname not in _FRAMING:
            continue
        if lname == "content-length":
            if _DIGITS.fullmatch(value) is None:
                raise GrammarError(f"bad Content-Length: {value[:40]!r}")
            if length is not None and length != int(value):
                raise GrammarError("conflicting Content-Length headers")
            length = int(value)
        elif lname == "transfer-encoding":
            if chunked or value.lower() != "chunked":
                raise GrammarError(f"unsupported Transfer-Encoding: {value[:40]!r}")
            chunked = True
        elif lname == "connection":
            connection += [t.strip() for t in value.lower().split(",")]
        elif lname == "content-type":
            content_type = value.partition(";")[0].strip().lower()
    if chunked and length is not None:
        raise GrammarError("both Content-Length and Transfer-Encoding (RFC 9112 6.3)")
    if chunked and version == b"0":
        raise GrammarError("Transfer-Encoding in an HTTP/1.0 response")
    return headers, length, chunked, connection, content_type
