"""The Slurm releases slurmk8s supports, and everything that differs between them.

This table is the only place version differences live (``tests/test_versions.py``
fails on a Slurm release written anywhere else in the code, the templates or the
entrypoints). The renderer, the API's enum, the image builds and the Slurm
facade read their per-release values from here; none of them compares
versions. Each column is checked against every release's real daemons, plugin
files and commands, from the images built on its Debian suite
(``tests/test_image_build.py``, ``tests/test_slurm_json.py``); SchedMD's release
notes say where a value comes from, the daemons whether it holds.

Pure: no imports from the rest of slurmk8s, so every layer may use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Options of mmdebstrap for a suite whose Release file has passed its
#: Valid-Until date (a snapshot of the archive, as forky's is here).
EXPIRED_RELEASE_OK = ('--aptopt=Acquire::Check-Valid-Until "false"',)


@dataclass(frozen=True)
class Release:
    """One supported Slurm release (``YY.MM``) and how slurmk8s speaks to it."""

    version: str

    # --- Images: the Debian suite whose own Slurm packages are this release ----------------
    debian_suite: str
    #: The exact Debian version of that suite's Slurm packages the images install
    #: (``apt-get install slurmd=<this>``): an image built another day carries the same
    #: Slurm, or its build fails naming the version it could not get.
    slurm_package_version: str
    #: Extra mmdebstrap options for that suite.
    mmdebstrap_options: tuple[str, ...]
    #: The suite whose SSSD the sssd image runs and whose sss client (libnss-sss) the Slurm
    #: images hold (spec.identity.ldap): the release's own where it packages SSSD. Forky has
    #: none (November 2026): trixie's, whose libnss-sss installs on forky alone.
    sssd_suite: str

    # --- slurm.conf -------------------------------------------------------------------------
    #: Where preempted jobs are told to get their own --signal: (key, value). Up to 22.05
    #: SlurmctldParameters=preempt_send_user_signal; from 23.02 PreemptParameters=send_user_signal.
    preempt_user_signal: tuple[str, str]
    #: SelectType. select/cons_res is gone from 23.11; cons_tres (GRES-aware) exists everywhere.
    select_type: str
    #: TopologyPlugin of spec.topology's switch tree (topology.conf; topology.yaml from 25.05
    #: may hold several topologies, topology.conf still works).
    topology_tree_plugin: str
    #: Whether that tree places dynamic nodes: slurmctld finds a node that topology.conf names
    #: only if the node was registered when it read the file, and 24.11 and 26.05 read it again
    #: on `scontrol reconfigure` (which the operator runs once a node is rendered into it).
    #: 22.05 never does (a reconfigure looks the switches' nodes up before the dynamic nodes
    #: are back): no switch reaches the node, and every job is "never runnable".
    topology_places_dynamic_nodes: bool
    #: TopologyPlugin of a flat network (not written: it is the default): topology/none up to
    #: 23.02, topology/default from 23.11, topology/flat in 26.05 (Debian's plugin files).
    topology_flat_plugin: str
    #: AuthType values this release has: auth/munge everywhere; auth/slurm (no munged) from 23.11.
    auth_types: tuple[str, ...]
    #: The key that names a job container plugin: JobContainerType, NamespaceType from 25.11.
    job_container_key: str
    #: srun --mpi types of Debian's build of this release, beside none. forky's 26.05 has no
    #: mpi/pmix (its libpmix is 7.0): MPI jobs use pmi2 there.
    mpi_types: tuple[str, ...]

    # --- slurmrestd ---------------------------------------------------------------------------
    #: The openapi data parser versions slurmrestd offers, oldest first.
    rest_parsers: tuple[str, ...]
    #: slurmrestd -s: the plugin of slurmctld's endpoints (no slurmdbd). Up to 23.02 one plugin
    #: per data parser (openapi/v0.0.N); from 23.11 openapi/slurmctld with data_parser plugins.
    rest_openapi_plugin: str
    #: slurmrestd -d: the data parser it loads (the newest), or None before data_parser plugins.
    rest_data_parser: str | None

    # --- Commands and their JSON ----------------------------------------------------------------
    #: Commands with --json (sinfo and squeue everywhere; scontrol and sacctmgr from 23.02).
    json_commands: tuple[str, ...]
    #: The command whose JSON has one record per node under "nodes". 22.05's sinfo --json has;
    #: 24.11's and 26.05's sinfo --json groups nodes by state ("sinfo"), and their
    #: scontrol --json show nodes has the records (state a list: base state, then flags).
    nodes_command: tuple[str, ...]

    # --- Probes ---------------------------------------------------------------------------------
    #: Whether slurmctld answers HTTP GET /livez and /readyz on its own port (25.11+). The
    #: controller pod's probes use them there; before, the entrypoint's `scontrol ping`.
    ctld_http_probes: bool

    # --- Dynamic nodes (slurmd -Z) ------------------------------------------------------------
    #: The node state flag a dynamic node carries in sinfo/scontrol (DYNAMIC_NORM).
    dynamic_node_flag: str

    # --- Upgrades -------------------------------------------------------------------------------
    #: The major releases this one upgrades in place from, keeping jobs, state files and the
    #: accounting database (RELEASE_NOTES, "Slurm can be upgraded from version ..."): the two
    #: before it up to 24.05, the three before it from 24.11. Never a newer one.
    upgrades_from: tuple[str, ...]


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            version="22.05",
            debian_suite="bookworm",
            slurm_package_version="22.05.8-4+deb12u3",
            mmdebstrap_options=(),
            sssd_suite="bookworm",
            preempt_user_signal=("SlurmctldParameters", "preempt_send_user_signal"),
            select_type="select/cons_tres",
            topology_tree_plugin="topology/tree",
            topology_places_dynamic_nodes=False,
            topology_flat_plugin="topology/none",
            auth_types=("auth/munge",),
            job_container_key="JobContainerType",
            rest_parsers=("v0.0.36", "v0.0.37", "v0.0.38"),
            rest_openapi_plugin="openapi/v0.0.38",
            rest_data_parser=None,
            mpi_types=("pmi2", "pmix"),
            json_commands=("sinfo", "squeue"),
            nodes_command=("sinfo", "--json"),
            ctld_http_probes=False,
            dynamic_node_flag="DYNAMIC_NORM",
            upgrades_from=("20.11", "21.08"),
        ),
        Release(
            version="24.11",
            debian_suite="trixie",
            slurm_package_version="24.11.5-4+deb13u1",
            mmdebstrap_options=(),
            sssd_suite="trixie",
            preempt_user_signal=("PreemptParameters", "send_user_signal"),
            select_type="select/cons_tres",
            topology_tree_plugin="topology/tree",
            topology_places_dynamic_nodes=True,
            topology_flat_plugin="topology/default",
            auth_types=("auth/munge", "auth/slurm"),
            job_container_key="JobContainerType",
            rest_parsers=("v0.0.40", "v0.0.41", "v0.0.42"),
            rest_openapi_plugin="openapi/slurmctld",
            rest_data_parser="v0.0.42",
            mpi_types=("pmi2", "pmix"),
            json_commands=("sinfo", "squeue", "scontrol", "sacctmgr"),
            nodes_command=("scontrol", "--json", "show", "nodes"),
            ctld_http_probes=False,
            dynamic_node_flag="DYNAMIC_NORM",
            upgrades_from=("23.02", "23.11", "24.05"),
        ),
        Release(
            version="26.05",
            debian_suite="forky",
            slurm_package_version="26.05.5-1",
            mmdebstrap_options=EXPIRED_RELEASE_OK,
            sssd_suite="trixie",
            preempt_user_signal=("PreemptParameters", "send_user_signal"),
            select_type="select/cons_tres",
            topology_tree_plugin="topology/tree",
            topology_places_dynamic_nodes=True,
            topology_flat_plugin="topology/flat",
            auth_types=("auth/munge", "auth/slurm"),
            job_container_key="NamespaceType",
            rest_parsers=("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
            rest_openapi_plugin="openapi/slurmctld",
            rest_data_parser="v0.0.45",
            mpi_types=("pmi2",),
            json_commands=("sinfo", "squeue", "scontrol", "sacctmgr"),
            nodes_command=("scontrol", "--json", "show", "nodes"),
            ctld_http_probes=True,
            dynamic_node_flag="DYNAMIC_NORM",
            upgrades_from=("24.11", "25.05", "25.11"),
        ),
    )
}

#: The supported releases, oldest first: the values spec.slurm.version accepts (the CRD's enum).
SUPPORTED: tuple[str, ...] = tuple(RELEASES)

#: The release of a SlurmCluster that names none, of the chart's images and of the demo.
DEFAULT = "26.05"


def release(version: str) -> Release:
    """The row of ``version``; KeyError names the supported releases."""
    try:
        return RELEASES[version]
    except KeyError:
        raise KeyError(f"Slurm {version} is not supported: slurmk8s supports {', '.join(SUPPORTED)}") from None


def _key(version: str) -> tuple[int, int]:
    year, month = version.split(".")
    return int(year), int(month)


def upgrade_problem(running: str, wanted: str) -> str | None:
    """Why a cluster running Slurm ``running`` cannot move to ``wanted`` in place, or None.

    Slurm reads the state files and database records of the few releases before its own
    (:attr:`Release.upgrades_from`) and of no newer one; across a wider step it loses the
    queued jobs and refuses the database."""
    if running == wanted:
        return None
    if not re.fullmatch(r"[0-9]{2}\.[0-9]{2}", running):  # fail closed: an unknown release moves nowhere
        return (f"the cluster's running release is {running!r} (its controller StatefulSet's "
                "app.kubernetes.io/version label), not a Slurm release: restore the label")
    if _key(wanted) < _key(running):
        return (f"Slurm does not downgrade: the cluster runs {running}, and {wanted} cannot read its "
                f"state or accounting records. Set it back to {running}")
    allowed = release(wanted).upgrades_from
    if running in allowed:
        return None
    return (f"Slurm {wanted} upgrades in place only from {', '.join(allowed)}; the cluster runs {running}, "
            f"and its queued jobs and accounting records would be lost. Set it back to {running}, "
            f"or create a new cluster on {wanted}")
