"""Signatures under a per-run secret: HMAC-SHA256 of a few fields, the one signing scheme of Entrepot.

A secret is made once (`new_secret`) by the party that hands out or checks what is signed, and
reaches the others only through Ray (whose own token guards its calls). The dock signs its leases and
get receipts with its secret (`_leases`); `entrepot.grpo`'s weight channel signs its handshake and
every message with the run's (`entrepot.grpo.engines.weight_channel`). `sign` covers the fields'
``repr``, so fields are plain values: str, int, float, bytes, None, and tuples or lists of them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

__all__ = ["SECRET_BYTES", "new_secret", "sign", "signed"]

SECRET_BYTES = 32
"""Length of a secret (SHA-256's block is 64 bytes; 32 random bytes are its full strength)."""


def new_secret() -> bytes:
    """A fresh random secret (`secrets.token_bytes`)."""
    return secrets.token_bytes(SECRET_BYTES)


def sign(secret: bytes, *fields: Any) -> str:
    """The HMAC-SHA256 of `fields` (their repr) under `secret`, as 64 hex digits."""
    return hmac.new(secret, repr(fields).encode(), hashlib.sha256).hexdigest()


def signed(secret: bytes, token: object, *fields: Any) -> bool:
    """Whether `token` is `sign(secret, *fields)` (compared in constant time; a non-str is not)."""
    return isinstance(token, str) and hmac.compare_digest(token, sign(secret, *fields))
