"""slurmk8s: Slurm on Kubernetes.

Subpackages: ``api`` (typed resources, CRDs), ``render`` (pure rendering),
``slurm`` (the one facade that talks to Slurm), ``operator`` and ``bridge``
(mapped from the top-level folders of the same names), ``templates``.
"""

__version__ = "0.1.0"
