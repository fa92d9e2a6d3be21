"""The Document: the unit every data step consumes and produces.

`id` is stable: derived from the WARC record id (or a content hash when there is none), so the
same input always yields the same ids and dedup/split decisions are reproducible.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Document:
    id: str
    text: str
    url: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


def content_id(text: str, prefix: str = "sha256:") -> str:
    """A stable id for a document that has no record id of its own."""
    return prefix + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
