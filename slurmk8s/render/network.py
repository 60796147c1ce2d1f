"""The cluster's NetworkPolicies: one per component, each admitting only the
traffic that component serves, from the pods that need it (and, with
``spec.network.egress``, letting out only what it sends). Pure.

The flows (``FLOWS``), by destination:

- slurmctld (6817) from every Slurm pod of the cluster: slurmd, lent slurmd,
  login (the commands), slurmrestd, slurmdbd (its updates);
- the agent (6830) from the Helm release's operator and bridge pods (any pod
  when the operator does not know its release: the agent still asks for the
  cluster's token); its Slurm metrics (6831) from pods of the namespaces in
  ``spec.metrics.scrapeFrom`` (when empty, pods of the cluster's own
  namespace alone: never every namespace);
- slurmd, of node sets and lent, from each other and from login on every port
  (slurmd's forwarding, srun from login, and the jobs' own traffic: MPI,
  NCCL, a notebook reached through the login pod), and from slurmctld on
  slurmd's port and srun's (``slurmConfig.srunPortRange``: srun in a batch
  job);
- login: SSH from ``spec.network.sshFrom`` (anywhere when empty); srun's ports
  from slurmctld and every slurmd;
- slurmrestd (6820) from anywhere: it asks for a JWT (with egress rules, login
  and slurmd pods may send to it);
- slurmdbd (6819) from slurmctld, slurmd, login and slurmrestd (sacct,
  sacctmgr, the accounting endpoints);
- MariaDB (3306) from slurmdbd alone.

Traffic between a pod and its node (the kubelet's probes) is never cut
by a NetworkPolicy. Egress rules mirror these, plus DNS (53, UDP and TCP) to
anywhere, slurmdbd to its database's port at the database's addresses
alone when the database is external (its IPv4 address, ``egressCidrs``),
and the pods that run sssd (controller, slurmd, login) to the
directory's ports (``spec.identity.ldap``) at its servers' addresses alone
(the IPv4 addresses its URIs name and ``egressCidrs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.identity import directory_blocks, uri_port
from ..api.network import egress_blocks
from . import names
from .controller import AgentClients
from .pods import Builder
from .slurmd import LENT_COMPONENT

__all__ = ["policies", "FLOWS"]

SLURMD_COMPONENTS = ("worker", LENT_COMPONENT)


@dataclass(frozen=True)
class Flow:
    """``sources`` (components of the cluster, or "*": anyone, "agent-clients": the operator
    and the bridge, "ssh-clients": ``spec.network.sshFrom``, "scrapers": pods of
    ``spec.metrics.scrapeFrom``'s namespaces) reach ``destination`` on
    ``ports`` (None: every port)."""

    destination: str
    sources: tuple[str, ...]
    ports: tuple[str, ...] | None


#: Who reaches what; ports by name: resolved in :func:`_port`.
FLOWS = (
    Flow("controller", ("worker", LENT_COMPONENT, "login", "restapi", "slurmdbd"), ("slurmctld",)),
    Flow("controller", ("agent-clients",), ("agent",)),
    Flow("controller", ("scrapers",), ("metrics",)),
    Flow("worker", (*SLURMD_COMPONENTS, "login"), None),
    Flow("worker", ("controller",), ("slurmd", "srun")),
    Flow("login", ("ssh-clients",), ("ssh",)),
    Flow("login", ("controller", *SLURMD_COMPONENTS), ("srun",)),
    Flow("restapi", ("*",), ("slurmrestd",)),
    Flow("restapi", ("login", *SLURMD_COMPONENTS), ("slurmrestd",)),  # with egress rules: their way out
    Flow("slurmdbd", ("controller", *SLURMD_COMPONENTS, "login", "restapi"), ("slurmdbd",)),
    Flow("database", ("slurmdbd",), ("mariadb",)),
)


def _port(b: Builder, name: str) -> dict:
    c = b.c
    if name == "srun":
        first, last = (int(p) for p in c.spec.slurm_config.srun_port_range.split("-"))
        return {"protocol": "TCP", "port": first, "endPort": last}
    numbers = {"slurmctld": names.SLURMCTLD_PORT, "agent": names.AGENT_PORT, "metrics": names.METRICS_PORT,
               "slurmd": names.SLURMD_PORT,
               "ssh": names.SSH_PORT, "slurmrestd": names.SLURMRESTD_PORT, "slurmdbd": names.SLURMDBD_PORT,
               "mariadb": names.MARIADB_PORT}
    return {"protocol": "TCP", "port": numbers[name]}


def _pods(b: Builder, components: tuple[str, ...]) -> dict:
    """A podSelector for the cluster's pods of ``components``."""
    if components == ("worker",):
        components = SLURMD_COMPONENTS  # lent slurmd pods are workers too
    return {"matchLabels": {"app.kubernetes.io/name": "slurm", "app.kubernetes.io/instance": b.c.name},
            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                  "values": sorted(set(components))}]}


def _peers(b: Builder, sources: tuple[str, ...], clients: AgentClients | None) -> list[dict] | None:
    """The peers of ``sources``; None: anyone."""
    if sources == ("*",):
        return None
    if sources == ("agent-clients",):
        if clients is None:
            return None
        return [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": clients.namespace}},
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/instance": clients.release},
                "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                      "values": sorted(clients.components)}],
            },
        }]
    if sources == ("scrapers",):  # pods of those namespaces; when none is named, of the cluster's own alone
        return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}, "podSelector": {}}
                for ns in b.c.spec.metrics.scrape_from] or [{"podSelector": {}}]
    if sources == ("ssh-clients",):
        blocks = b.c.spec.network.ssh_from
        return [{"ipBlock": {"cidr": cidr}} for cidr in blocks] or None
    return [{"podSelector": _pods(b, sources)}]


def _rule(peers: list[dict] | None, key: str, ports: list[dict] | None) -> dict:
    rule = {}
    if ports is not None:
        rule["ports"] = ports
    if peers is not None:
        rule[key] = peers
    return rule


def _present(b: Builder) -> set[str]:
    """The cluster's components that run pods."""
    c = b.c
    out = {"controller", "worker", LENT_COMPONENT, "login"}
    if c.spec.rest_api.enabled:
        out.add("restapi")
    if c.spec.accounting.enabled:
        out.add("slurmdbd")
        if c.spec.accounting.database.external is None:
            out.add("database")
    return out


DNS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def policies(b: Builder, clients: AgentClients | None) -> list[dict]:
    """The cluster's NetworkPolicies (none with ``spec.network.policies`` off)."""
    c = b.c
    if not c.spec.network.policies:
        return []
    present = _present(b)
    out = []
    for component in ("controller", "worker", "login", "restapi", "slurmdbd", "database"):
        if component not in present:
            continue
        ingress = []
        for f in FLOWS:
            sources = tuple(s for s in f.sources if s in present or s in ("*", "agent-clients", "ssh-clients")
                            or (s == "scrapers" and c.spec.metrics.enabled))
            if f.destination != component or not sources:
                continue
            ports = None if f.ports is None else [_port(b, p) for p in f.ports]
            ingress.append(_rule(_peers(b, sources, clients), "from", ports))
        spec: dict[str, Any] = {"podSelector": _pods(b, (component,)), "policyTypes": ["Ingress"], "ingress": ingress}
        if c.spec.network.egress:
            spec["policyTypes"].append("Egress")
            spec["egress"] = _egress(b, component, present)
        out.append(b.obj("networking.k8s.io/v1", "NetworkPolicy",
                         b.meta(names.network_policy(c, component), component), spec=spec))
    return out


def _egress(b: Builder, component: str, present: set[str]) -> list[dict]:
    """What ``component`` sends: the flows it is a source of, to their destinations, and DNS."""
    sources = {component} | (set(SLURMD_COMPONENTS) if component == "worker" else set())
    rules: list[dict[str, Any]] = [{"ports": DNS}]
    for f in FLOWS:
        if f.destination in present and sources & set(f.sources):
            ports = None if f.ports is None else [_port(b, p) for p in f.ports]
            rules.append(_rule([{"podSelector": _pods(b, (f.destination,))}], "to", ports))
    external = b.c.spec.accounting.database.external if b.c.spec.accounting.enabled else None
    if component == "slurmdbd" and external is not None:
        # Its port at its address alone: a database on 443 must not open 443 to the world.
        blocks = egress_blocks([external.host], external.egress_cidrs)
        rules.append({"ports": [{"protocol": "TCP", "port": external.port}],
                      "to": [{"ipBlock": {"cidr": cidr}} for cidr in blocks]})
    ldap = b.c.spec.identity.ldap
    if component in DIRECTORY_CLIENTS and ldap is not None and directory_blocks(ldap):
        # Its ports at its servers' addresses alone (ldaps://x:443 must not open 443 to the world).
        uri_ports = dict.fromkeys(uri_port(uri) for uri in ldap.uris)
        rules.append({"ports": [{"protocol": "TCP", "port": p} for p in uri_ports],
                      "to": [{"ipBlock": {"cidr": cidr}} for cidr in directory_blocks(ldap)]})
    return rules


#: The components whose pods run sssd (render/identity.py), and so reach the directory.
DIRECTORY_CLIENTS = ("controller", "worker", "login")

