"""The sandbox: a SlurmCluster run on this machine, each pod as processes in
Linux namespaces, with Debian's Slurm binaries and the images' entrypoints.

``plan`` (pure) turns rendered objects into pods; ``runtime`` runs a pod;
``sandbox`` brings a whole cluster up and down.
"""

from .sandbox import DEFAULT_STATE_DIR, Sandbox, SandboxFailed

__all__ = ["Sandbox", "SandboxFailed", "DEFAULT_STATE_DIR"]
