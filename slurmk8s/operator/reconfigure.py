"""When a config change reaches Slurm. Pure.

A config change updates the ConfigMap; the kubelet then updates the files in
the controller pod; once the agent's hash of ``/etc/slurm`` equals the
rendered hash, ``scontrol reconfigure`` runs and ``status.configHash``
records it. slurmctld is never restarted for a config change.
"""

from __future__ import annotations

__all__ = ["decide_reconfigure"]


def decide_reconfigure(rendered: str, applied: str | None, seen: str | None) -> tuple[bool, str | None]:
    """Whether to run ``scontrol reconfigure`` now, and if not, why we wait.

    ``rendered``: hash of the config files just rendered (in the ConfigMap).
    ``applied``: status.configHash, the last config reconfigured.
    ``seen``: the agent's hash of the files in the slurmctld pod (None: unknown).
    """
    if applied == rendered:
        return False, None
    if seen is None:
        return False, "the config changed; waiting for the Slurm agent to reconfigure"
    if seen != rendered:
        return False, ("the config changed; waiting for the kubelet to update /etc/slurm in the "
                       "controller pod (up to about a minute)")
    return True, None
