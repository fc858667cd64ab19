"""Content fingerprints: short stable digests used as cache keys by the data modules."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(*parts: Any) -> str:
    """A short stable hex digest of JSON-able ``parts`` (used as cache keys)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.blake2b(blob, digest_size=8).hexdigest()
