"""Image input: a small PNG made here, sent as a data URL; the reply must name its colour."""

from __future__ import annotations

import base64
import struct
import zlib

from operations.validate.client import THINKING_OFF, Client
from operations.validate.result import FAIL, PASS, Result


def make_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour 8-bit RGB PNG (signature, IHDR, one IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width  # filter byte 0 (none) per scanline
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def check_image(client: Client, args) -> Result:
    picture = data_url(make_png(64, 64, (220, 20, 20)))
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": picture}},
        {"type": "text", "text": "What colour fills this picture? Answer with one word."},
    ]}]
    reply = client.chat(messages, max_tokens=64, temperature=0, **THINKING_OFF)
    if "red" in reply.content.lower():
        return Result("image", PASS, f"{reply.content.strip()[:60]!r}")
    return Result("image", FAIL, f"expected red, got {reply.content[:120]!r}")
