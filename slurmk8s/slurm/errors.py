"""The one mark of a caller's mistake in the Slurm facade."""

from __future__ import annotations

__all__ = ["InvalidArgument"]


class InvalidArgument(ValueError):
    """A value given to the Slurm facade that it refuses: a node name, drain
    reason, signal or association. The agent answers it 400. Every other
    ValueError from the facade is Slurm's own answer that could not be read
    (the agent answers 502), never the caller's."""
