"""A byte-level Server-Sent Events parser: the client's hot path.

Only what OpenAI-style streams use: `data:` fields (multi-line data joined with "\\n" as the spec says),
events separated by a blank line, CRLF or LF line ends, comment lines (":") and other fields ignored.
It works on the raw bytes of a response body (`aiter_raw()`) and never decodes text it does not need.
"""

from __future__ import annotations


class SSEParser:
    """Feed network chunks, get back the `data` payloads of the events they completed."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # NOTE: a chunk ending in "\r" keeps it in the tail; the next chunk's "\n" completes the CRLF.
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out: list[bytes] = []
        for ev in events:
            if ev.startswith(b"data:") and b"\n" not in ev:  # the common case: one data line
                out.append(ev[6:] if ev[5:6] == b" " else ev[5:])
                continue
            data = [ln[6:] if ln[5:6] == b" " else ln[5:] for ln in ev.split(b"\n") if ln.startswith(b"data:")]
            if data:
                out.append(b"\n".join(data))
        return out

    def flush(self) -> list[bytes]:
        """Payload of a final event the server did not terminate with a blank line (stream closed)."""
        rest, self._buf = self._buf, b""
        return self.feed(rest + b"\n\n") if rest.strip() else []
