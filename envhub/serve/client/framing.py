"""The client's side of RFC 6455 framing for whole messages (the hot path of every request).

websockets' sans-I/O protocol keeps the connection's state and reads every other frame (pings,
a closing handshake, fragments): :class:`~envhub.serve.client.wire.Wire` hands those to it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from envhub.serve.client.base import MAX_REPLY_BYTES

TEXT, BINARY, CONTROL, REST = range(4)
"""What :meth:`Frames.read` found: a text or binary message, a control frame, or the rest of
the bytes (for websockets' protocol to read)."""

_MESSAGES = {0x81: TEXT, 0x82: BINARY}
"""A whole message's first byte (FIN, no extension bits, its opcode)."""


class Frames:
    """Reads the server's frames (unmasked) and writes text frames (masked with a random key
    each, as the RFC asks)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._need = 2
        """Bytes the buffer must hold before the next frame can be read."""
        self._keys = b""
        self._key_at = 0
        self._apply_mask = _masker()

    def read(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames in ``data`` and the bytes before it, as ``(kind, payload)``; a
        control frame's payload is the whole frame (for websockets' protocol), and once a frame
        is one of neither (a fragment, a masked or oversized one), the rest of the bytes are."""
        buffer = self._buffer
        if not buffer and len(data) >= 2:  # the common case: whole frames in one read
            buffer = memoryview(data)
        else:
            buffer.extend(data)
            if len(buffer) < self._need:
                return []
        found: list[tuple[int, bytes]] = []
        at, end = 0, len(buffer)
        while end - at >= 2:
            head, second = buffer[at], buffer[at + 1]
            length, start = second & 0x7F, at + 2
            if length == 126:
                length, start = int.from_bytes(buffer[at + 2 : at + 4], "big"), at + 4
            elif length == 127:
                length, start = int.from_bytes(buffer[at + 2 : at + 10], "big"), at + 10
            if start > end:  # the length's bytes are still to come
                self._need = start - at
                break
            kind = _MESSAGES.get(head)
            if kind is None and not (0x88 <= head <= 0x8A and length <= 125):
                kind = REST  # (a mask bit from a server is an error websockets reports)
            elif second & 0x80 or length > MAX_REPLY_BYTES:
                kind = REST
            if kind == REST:
                found.append((REST, bytes(buffer[at:])))
                at = end
                break
            if end - start < length:
                self._need = start + length - at
                break
            if kind is None:
                found.append((CONTROL, bytes(buffer[at : start + length])))
            else:
                found.append((kind, bytes(buffer[start : start + length])))
            at = start + length
        else:
            self._need = 2
        if isinstance(buffer, memoryview):
            self._buffer = bytearray(buffer[at:])
        else:
            del buffer[:at]
        if len(self._buffer) < 2:
            self._need = 2
        return found

    def text(self, payload: bytes) -> bytes:
        """A masked text frame of ``payload`` (UTF-8)."""
        n = len(payload)
        if n < 126:
            head = bytes((0x81, 0x80 | n))
        elif n < 65536:
            head = bytes((0x81, 0xFE)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x81, 0xFF)) + n.to_bytes(8, "big")
        key = self._key()
        return head + key + self._apply_mask(payload, key)

    def _key(self) -> bytes:
        """4 random bytes, from a stock of them read from the OS's generator 1 KB at a time
        (what websockets reads 4 bytes at a time)."""
        if self._key_at >= len(self._keys):
            self._keys, self._key_at = os.urandom(1024), 0
        key = self._keys[self._key_at : self._key_at + 4]
        self._key_at += 4
        return key


@functools.cache
def _masker() -> Any:
    """websockets' ``apply_mask`` (its C one where built), imported when a connection opens."""
    try:
        from websockets.speedups import apply_mask
    except ImportError:  # websockets without its C extension
        from websockets.utils import apply_mask
    return apply_mask
