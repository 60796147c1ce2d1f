"""Structured logging to stderr (stdout is for command output such as YAML)."""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure(level: str = "info", fmt: str = "console") -> None:
    """Send structlog (and stdlib logging, e.g. kopf's) to stderr."""
    lvl = getattr(logging, level.upper())
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # A traceback (exc_info) as text in JSON; the console renderer formats its own.
            *([structlog.processors.format_exc_info] if fmt == "json" else []),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(levelname)s %(name)s: %(message)s")


def get(name: str | None = None):
    return structlog.get_logger(name)
