"""Images for vision-language traffic: made here (seeded, any size, PNG or JPEG) and measured from
their bytes (width and height read off the PNG, JPEG, GIF or WebP header, without decoding pixels).

Made images are blocks of seeded colour over a gradient: every seed gives different pixels (a server's
processor cache and prefix cache key images by their bytes, so a repeated image would be a cache hit,
not a measurement), while whole 16-pixel blocks keep PNG files small (zlib sees repeated rows) and
cheap to make on the client. The server decodes, resizes and encodes them like any photo of that size:
its cost depends on the size, not on what the picture shows.

PNG is written with zlib alone; JPEG needs Pillow (present wherever vLLM is installed).
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from autotune.errors import UserError

FORMATS = ("png", "jpeg")
MAX_SIDE = 16384          # larger than any vision processor accepts; a typo such as 1024000 stops here
_BLOCK = 16
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
_DATA_URI = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


@dataclass(frozen=True)
class ImageRef:
    """One image of a request: its size, and the bytes to send as a data URI (`url`). `message` is the
    index of the chat message it belongs to (a recorded trace keeps where it was; made images go with
    the last user message)."""

    width: int
    height: int
    fmt: str = "png"
    url: str | None = None
    message: int | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height


def parse_size(text: str, where: str) -> tuple[int, int]:
    """`1024x768` -> (1024, 768), both sides in 1..MAX_SIDE."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
    if not m:
        raise UserError(f"{where}: image size {text!r} is not WIDTHxHEIGHT (e.g. 1024x768)")
    w, h = int(m[1]), int(m[2])
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise UserError(f"{where}: image size {text!r}: each side must be 1..{MAX_SIDE} pixels")
    return w, h


def _block_rows(width: int, height: int, seed: int) -> np.ndarray:
    """One pixel row per band of blocks (the rows inside a band are equal): seeded block colours, halved,
    over a left-to-right ramp."""
    rng = np.random.default_rng(seed)
    bands, cols = -(-height // _BLOCK), -(-width // _BLOCK)
    blocks = rng.integers(0, 128, (bands, cols, 3), dtype=np.uint8)
    rows = np.repeat(blocks, _BLOCK, axis=1)[:, :width]
    ramp = (np.arange(width, dtype=np.uint16) * 64 // max(width, 1)).astype(np.uint8)
    return rows + ramp[None, :, None]


def _pixels(width: int, height: int, seed: int) -> np.ndarray:
    return np.repeat(_block_rows(width, height, seed), _BLOCK, axis=0)[:height]


def _png(width: int, height: int, seed: int) -> bytes:
    """A truecolour PNG whose rows are filtered 'Up' (type 2): a row inside a band of blocks repeats the
    one above, so it is all zeros, and only the first row of each band carries a difference."""
    bands = _block_rows(width, height, seed).reshape(-1, width * 3)
    diff = bands.copy()
    diff[1:] -= bands[:-1]          # uint8 arithmetic wraps modulo 256, as the filter wants
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)
    rows[:, 0] = 2
    rows[::_BLOCK, 1:] = diff[:len(range(0, height, _BLOCK))]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
            + chunk(b"IEND", b""))


def _jpeg(pixels: np.ndarray) -> bytes:
    try:
        from PIL import Image
    except ImportError:
        raise UserError("JPEG images need Pillow (pip install pillow); format=png needs nothing") from None
    import io

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=85)
    return buf.getvalue()


def make_image(width: int, height: int, seed: int, fmt: str = "png") -> bytes:
    """The encoded bytes of a `width` x `height` image, the same for the same seed."""
    if fmt not in FORMATS:
        raise UserError(f"image format {fmt!r} is unknown (one of {', '.join(FORMATS)})")
    return _png(width, height, seed) if fmt == "png" else _jpeg(_pixels(width, height, seed))


def data_uri(data: bytes, fmt: str) -> str:
    return f"data:{_MIME.get(fmt, 'application/octet-stream')};base64," + base64.b64encode(data).decode("ascii")


def made_image(width: int, height: int, seed: int, fmt: str = "png", message: int | None = None) -> ImageRef:
    """An ImageRef carrying a made image as a data URI."""
    return ImageRef(width, height, fmt, data_uri(make_image(width, height, seed, fmt), fmt), message)


def decode_data_uri(url: str) -> bytes | None:
    """The bytes of a base64 data URI; None for anything else (an http URL, a malformed URI)."""
    m = _DATA_URI.match(url[:200])
    if not m or not m["b64"]:
        return None
    try:
        return base64.b64decode(url[m.end():], validate=False)
    except (ValueError, TypeError):
        return None


def image_size(data: bytes) -> tuple[int, int, str] | None:
    """(width, height, format) from an encoded image's header; None when the format is not recognised."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return w, h, "png"
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return w, h, "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int, str] | None:
    """Walk the JPEG markers to the first start-of-frame (SOF0..SOF15 but DHT, JPG and DAC)."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:      # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > n:
                return None
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h, "jpeg"
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int, str] | None:
    kind = data[12:16]
    if kind == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF, "webp"
    if kind == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, "webp"
    if kind == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1, "webp"
    return None


def uri_size(url: str) -> tuple[int, int, str] | None:
    """The size of the image a data URI holds; None for a URL (not fetched) or unreadable bytes."""
    data = decode_data_uri(url)
    return None if data is None else image_size(data)
