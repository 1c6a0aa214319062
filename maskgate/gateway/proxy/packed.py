"""Packed masks at the gateway, without NumPy (protocol/mask_format.py has the layout).

The check of an answer that passes through decodes only its offsets (`array('i')`, T + 1
ints) and reads the ids from their base64 text with `bytes` operations, never a Python step
per id (`offsets_of`, `check_ids`). Conversions decode everything: lists to packed for an
upstream that answers lists (SGLang), packed to lists for a client that asked lists; the
exact checks (`check_vocab`, `tokens_outside`) run on those decoded ids.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from bisect import bisect_left
from functools import cache
from itertools import accumulate, chain, pairwise, repeat
from typing import Any

from maskgate.protocol.mask_format import IDS, MASK, OFFSETS

_SWAP = sys.byteorder != "little"  # the wire is little-endian
assert array("i").itemsize == 4, "packed masks need a 4-byte C int"


class PackedMaskError(ValueError):
    """A packed mask that breaks the layout (the message says how)."""


def decode(meta: dict[str, Any]) -> tuple[array[int], array[int]]:
    """meta_info's packed fields -> (ids, offsets): the offsets checked as by `offsets_of`,
    the ids decoded (strict base64) and counted against the last offset. Raises
    PackedMaskError."""
    offsets = offsets_of(meta)
    ids = _int32s(meta.get(IDS), IDS)
    if len(ids) != offsets[-1]:
        raise PackedMaskError(f"{OFFSETS} ends at {offsets[-1]}, not the id count {len(ids)}")
    return ids, offsets


def offsets_of(meta: dict[str, Any]) -> array[int]:
    """The decoded offsets (T + 1 of them, a few hundred bytes), checked: from 0 and
    non-decreasing. Raises PackedMaskError."""
    offsets = _int32s(meta.get(OFFSETS), OFFSETS)
    if not offsets or offsets[0] != 0:
        raise PackedMaskError(f"{OFFSETS} must start at 0")
    if offsets != array("i", sorted(offsets)):  # timsort: one linear pass on sorted input
        raise PackedMaskError(f"{OFFSETS} must be non-decreasing")
    return offsets


def check_ids(meta: dict[str, Any], offsets: array[int], vocab_size: int | None) -> None:
    """The ids without decoding them (a full base64 decode costs ~100 us per 6,400 ids, more
    than the rest of the mask path): their count from the text's length must be the last
    offset, the text base64, and every id non-negative and, when the vocabulary is known,
    below it rounded up to a power of two, read from the base64 characters that hold each
    id's high bits."""
    text = meta.get(IDS)
    if not isinstance(text, str) or not text.isascii() or len(text) % 4:
        raise PackedMaskError(f"{IDS} must be base64 text (a multiple of 4 characters)")
    data = text.encode("ascii")
    pads = 2 if data.endswith(b"==") else int(data.endswith(b"="))
    if data.find(b"=", 0, len(data) - pads) >= 0:
        raise PackedMaskError(f"{IDS} is not valid base64")
    size = len(data) // 4 * 3 - pads
    if size % 4 or size // 4 != offsets[-1]:
        raise PackedMaskError(f"{OFFSETS} ends at {offsets[-1]}, not the id count {size / 4:g}")
    # The whole text against the alphabet in one pass; then only the characters that hold id
    # bits at or above the bound (the sign bit when the vocabulary is unknown), against the
    # characters that leave those bits zero.
    if data.translate(None, _PADDED):
        raise PackedMaskError(f"{IDS} is not valid base64")
    bits = 31 if vocab_size is None else max(1, (vocab_size - 1).bit_length())
    for pos, allowed in _allowed_chars(bits):
        if data[pos::16].translate(None, allowed):
            raise PackedMaskError(f"an id of {IDS} is outside the vocabulary [0, {vocab_size})")


def check_vocab(ids: array[int], vocab_size: int | None) -> None:
    """The exact bound, on decoded ids."""
    if ids and (min(ids) < 0 or (vocab_size is not None and max(ids) >= vocab_size)):
        raise PackedMaskError(f"an id of {IDS} is outside the vocabulary [0, {vocab_size})")


_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PADDED = _ALPHABET + b"="


@cache
def _allowed_chars(bits: int) -> tuple[tuple[int, bytes], ...]:
    """For ids below 2**bits: per character position of a 16-character period (12 bytes,
    three little-endian int32) that holds an id bit >= `bits` (the sign bit included), the
    base64 characters whose 6 bits leave those bits zero. Positions holding only lower bits
    are left out: any base64 character is fine there. "=" is allowed everywhere: padding
    holds no bits."""
    out = []
    for pos in range(16):
        forbidden = 0
        for i in range(6):  # the character's bits, most significant first
            stream_bit = 6 * pos + i
            byte, bit_in_byte = divmod(stream_bit, 8)
            id_bit = 8 * (byte % 4) + (7 - bit_in_byte)
            if id_bit >= bits:
                forbidden |= 1 << (5 - i)
        if forbidden:
            ok = bytes(c for v, c in enumerate(_ALPHABET) if not v & forbidden)
            out.append((pos, ok + b"="))
    return tuple(out)


def tokens_outside(ids: array[int], offsets: array[int], tokens: list[Any]) -> bool:
    """True when a sampled token is not in its own (ascending) mask."""
    try:
        pos = map(bisect_left, repeat(ids), tokens, offsets, offsets[1:])
        return not all(map(_hit, pos, offsets[1:], tokens, repeat(ids)))
    except TypeError:  # a sampled "id" that is not a number
        return True


def _hit(pos: int, end: int, token: Any, ids: array[int]) -> bool:
    return pos < end and ids[pos] == token


def to_packed(meta: dict[str, Any]) -> None:
    """Lists -> packed, in place: each token's ids ascending."""
    masks = meta[MASK]
    try:
        ids = array("i", chain.from_iterable(map(sorted, masks)))
        offsets = array("i", accumulate(map(len, masks), initial=0))
    except (TypeError, OverflowError) as e:
        raise PackedMaskError(f"{MASK} is not a list of int32 id lists") from e
    del meta[MASK]
    meta[IDS] = _b64(ids)
    meta[OFFSETS] = _b64(offsets)


def to_lists(meta: dict[str, Any], ids: array[int], offsets: array[int]) -> None:
    """Packed (already decoded) -> lists, in place."""
    del meta[IDS], meta[OFFSETS]
    meta[MASK] = [ids[a:b].tolist() for a, b in pairwise(offsets)]


def _int32s(value: Any, name: str) -> array[int]:
    if not isinstance(value, str):
        raise PackedMaskError(f"{name} must be a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PackedMaskError(f"{name} is not valid base64") from e
    if len(raw) % 4:
        raise PackedMaskError(f"{name} holds {len(raw)} bytes, not a whole number of int32")
    out = array("i")
    out.frombytes(raw)
    if _SWAP:
        out.byteswap()
    return out


def _b64(values: array[int]) -> str:
    if _SWAP:
        values = array("i", values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")
