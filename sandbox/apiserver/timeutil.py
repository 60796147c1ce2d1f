"""Timestamps as Kubernetes writes them, and kubectl's human-readable ages."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)


def rfc3339(t: datetime | None = None) -> str:
    """``metav1.Time``: whole seconds, UTC, ``Z``."""
    return (t or now()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro(t: datetime | None = None) -> str:
    """``metav1.MicroTime``: microseconds, UTC, ``Z``."""
    return (t or now()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(text: str) -> datetime | None:
    if not text or not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """kubectl's AGE format: ``45s``, ``3m20s``, ``15m``, ``5h10m``, ``3d4h``, ``2y``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None, at: datetime | None = None) -> str:
    t = parse(timestamp or "")
    if t is None:
        return "<unknown>"
    return human_duration(((at or now()) - t).total_seconds())
