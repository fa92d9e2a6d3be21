"""The protocol filter: a WARC record's HTTP status and content type against `data.protocol`."""

from __future__ import annotations

from typing import Any

from oreline.data.read.record import Record


def protocol_reason(record: Record | dict[str, Any], cfg) -> str | None:
    """Drop reason from HTTP status and content type ("http:status_404", "http:content_type_image/png").

    Records without an HTTP status (resource, conversion) pass the status check; a missing
    content type is reported as "http:content_type_none". `cfg` is `cfg.data.protocol`.
    """
    if not cfg.enabled:
        return None
    if isinstance(record, dict):
        status, ctype = record.get("http_status"), record.get("content_type") or ""
    else:
        status, ctype = record.http_status, record.content_type
    if status is not None and status not in cfg.statuses:
        return f"http:status_{status}"
    if cfg.content_types and ctype not in cfg.content_types:
        return f"http:content_type_{ctype or 'none'}"
    return None
