"""NetworkPolicy, as Kubernetes 1.33 defines it, compiled to one nftables table
for the sandbox's pod network. Pure: pods, namespaces and policies in, the
ruleset's text out; ``netpolwatch`` applies it.

The semantics (networking.k8s.io/v1):
- a pod is isolated for ingress (egress) when a policy of its namespace selects
  it (``spec.podSelector``, empty: every pod) with that type in
  ``policyTypes``. Absent, ``policyTypes`` is Ingress, plus Egress when the
  policy has egress rules;
- a connection is allowed when the source's egress allows it (or the source is
  not egress-isolated) and the destination's ingress allows it (or it is not
  ingress-isolated). Replies of an allowed connection always flow;
- a rule without ``from``/``to`` allows every peer; one without ``ports``
  every port and protocol. A peer is a ``podSelector`` (pods of the policy's
  namespace), a ``namespaceSelector`` (every pod of those namespaces), both
  (those pods of those namespaces), or an ``ipBlock`` (``cidr`` less
  ``except``). A port is a number or a container port's name (``protocol``
  TCP unless said), to ``endPort`` when set;
- traffic between a pod and its node is always allowed, both ways (the
  kubelet's probes; here also the API server, which calls webhooks, and pods
  that call it), as Kubernetes documents it.

Traffic is dropped, not rejected: a denied connection times out.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .apiserver.selectors import selects

#: nftables' chain names: short, from the pod's address.
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


@dataclass(frozen=True)
class Endpoint:
    """A pod on the network: where it is, its labels, its named container ports."""

    namespace: str
    name: str
    ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    #: (name, protocol) -> port number, from its containers' ports
    named_ports: Mapping[tuple[str, str], int] = field(default_factory=dict)


def endpoint(pod: Mapping) -> Endpoint | None:
    """A Pod object (as the API serves it) -> its Endpoint; None while it has no
    address or once it has ended."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    ip = status.get("podIP")
    if not ip or status.get("phase") in ("Succeeded", "Failed") or (pod.get("spec") or {}).get("hostNetwork"):
        return None
    ports = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name"):
                ports[(p["name"], p.get("protocol") or "TCP")] = int(p["containerPort"])
    return Endpoint(meta.get("namespace", "default"), meta.get("name", ""), ip, dict(meta.get("labels") or {}), ports)


def _types(spec: Mapping) -> set[str]:
    if spec.get("policyTypes"):
        return set(spec["policyTypes"])
    return {"Ingress", "Egress"} if spec.get("egress") else {"Ingress"}



@dataclass(frozen=True)
class Peers:
    """Who a rule's peers are: pods (by address) and address blocks."""

    pods: tuple[Endpoint, ...] = ()
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (cidr, excepts)
    anyone: bool = False


def _peers(rule_peers: Sequence[Mapping] | None, policy_ns: str, pods: Sequence[Endpoint],
           namespaces: Mapping[str, Mapping[str, str]]) -> Peers:
    if not rule_peers:
        return Peers(anyone=True)
    chosen: dict[str, Endpoint] = {}
    blocks = []
    for peer in rule_peers:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            if ipaddress.ip_network(block["cidr"], strict=False).version == 4:
                blocks.append((block["cidr"], tuple(e for e in block.get("except") or ()
                                                    if ipaddress.ip_network(e, strict=False).version == 4)))
            continue
        ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
        for p in pods:
            if ns_sel is None:
                in_ns = p.namespace == policy_ns
            else:
                in_ns = p.namespace in namespaces and selects(ns_sel, namespaces[p.namespace])
            if in_ns and (pod_sel is None or selects(pod_sel, p.labels)):
                chosen[p.ip] = p
    return Peers(tuple(chosen.values()), tuple(blocks))


def _ports(rule_ports: Sequence[Mapping] | None, named_on: Endpoint | None) -> list[tuple[str, str]] | None:
    """A rule's ports as (nft protocol, "port" or "port-end") on ``named_on``
    (whose named ports a name resolves to); None: every port and protocol."""
    if not rule_ports:
        return None
    out = []
    for p in rule_ports:
        proto = p.get("protocol") or "TCP"
        port = p.get("port")
        if port is None:
            out.append((PROTOCOLS[proto], ""))
            continue
        if isinstance(port, str) and not port.isdigit():
            number = (named_on.named_ports if named_on else {}).get((port, proto))
            if number is None:
                continue  # a name this pod has no port of: nothing
            port = number
        end = p.get("endPort")
        out.append((PROTOCOLS[proto], f"{int(port)}-{int(end)}" if end and int(end) != int(port) else str(int(port))))
    return out


def _set(items: Iterable[str]) -> str:
    """Addresses and blocks as one nft set: overlaps merged (nft refuses overlapping intervals)."""
    nets = ipaddress.collapse_addresses(ipaddress.ip_network(i, strict=False) for i in set(items))
    return "{ " + ", ".join(str(n.network_address) if n.prefixlen == 32 else str(n) for n in nets) + " }"


def _port_rules(match: str, ports: list[tuple[str, str]] | None) -> list[str]:
    """``match`` (an address match, or "") for these ports, each rule ending in return."""
    if ports is None:
        return [f"{match} return".strip()]
    by_proto: dict[str, list[str]] = defaultdict(list)
    for proto, port in ports:
        by_proto[proto].append(port)
    rules = []
    for proto, numbers in sorted(by_proto.items()):
        numbers = [n for n in numbers if n]
        dport = f" th dport {_set_ports(numbers)}" if numbers and len(numbers) == len(by_proto[proto]) else ""
        rules.append(f"{match} meta l4proto {proto}{dport} return".strip())
    return rules


def _set_ports(numbers: list[str]) -> str:
    """Ports and ranges as one nft set: overlapping or adjacent ones merged."""
    spans = sorted((int(n.split("-")[0]), int(n.split("-")[-1])) for n in numbers)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return "{ " + ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged) + " }"


def _allow(direction: str, rule_peers: Peers, rule_ports: Sequence[Mapping] | None, target: Endpoint) -> list[str]:
    """The nft rules (ending in ``return``: allowed) of one ingress or egress rule of ``target``."""
    field_ = "saddr" if direction == "ingress" else "daddr"
    rules: list[str] = []
    if rule_peers.anyone:
        # Named ports of an egress rule without peers resolve on no one here: numbers only.
        return _port_rules("", _ports(rule_ports, target if direction == "ingress" else None))
    if direction == "ingress" or not rule_ports:
        ports = _ports(rule_ports, target)
        if rule_peers.pods and ports != []:
            rules += _port_rules(f"ip {field_} {_set(p.ip for p in rule_peers.pods)}", ports)
    else:
        # Egress to pods: a named port is each peer's own.
        groups: dict[tuple, list[str]] = defaultdict(list)
        for peer in rule_peers.pods:
            ports = _ports(rule_ports, peer)
            if ports:
                groups[tuple(ports)].append(peer.ip)
        for ports, ips in groups.items():
            rules += _port_rules(f"ip {field_} {_set(ips)}", list(ports))
    block_ports = _ports(rule_ports, target if direction == "ingress" else None)
    if block_ports != []:
        for cidr, excepts in rule_peers.blocks:
            block = ipaddress.ip_network(cidr, strict=False)
            match = f"ip {field_} {block}" + (f" ip {field_} != {_set(excepts)}" if excepts else "")
            rules += _port_rules(match, block_ports)
    return rules


def isolation(pods: Sequence[Endpoint], namespaces: Mapping[str, Mapping[str, str]],
              policies: Sequence[Mapping]) -> dict[str, dict[str, list[str]]]:
    """For each isolated pod's address, its allow rules: {"ingress"|"egress": {ip: [rule, ...]}}.
    A pod isolated with no rule that allows anything has an empty list."""
    out: dict[str, dict[str, list[str]]] = {"ingress": {}, "egress": {}}
    for pol in policies:
        meta, spec = pol.get("metadata") or {}, pol.get("spec") or {}
        ns = meta.get("namespace", "default")
        selected = [p for p in pods if p.namespace == ns and selects(spec.get("podSelector") or {}, p.labels)]
        if not selected:
            continue
        types = _types(spec)
        for direction, key, peer_key in (("ingress", "Ingress", "from"), ("egress", "Egress", "to")):
            if key not in types:
                continue
            peers = [(_peers(rule.get(peer_key), ns, pods, namespaces), rule.get("ports"))
                     for rule in spec.get(direction) or []]
            for target in selected:
                rules = out[direction].setdefault(target.ip, [])
                for rule_peers, rule_ports in peers:
                    rules += _allow(direction, rule_peers, rule_ports, target)
    return out


def _chain(ip: str, direction: str) -> str:
    return f"{direction[:2]}-{ip.replace('.', '-')}"


def ruleset(table: str, subnet: str, gateway: str, pods: Sequence[Endpoint],
            namespaces: Mapping[str, Mapping[str, str]], policies: Sequence[Mapping]) -> str:
    """The whole table, replacing the one of that name in one transaction (``nft -f``).

    ``namespaces``: each namespace's labels (a namespaceSelector matches those);
    ``subnet``: the pod network; ``gateway``: the node's address on it.
    """
    rules = isolation(pods, namespaces, policies)
    lines = [f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{"]
    for direction in ("ingress", "egress"):
        field_ = "daddr" if direction == "ingress" else "saddr"
        isolated = sorted(rules[direction], key=ipaddress.ip_address)
        lines.append(f"  chain {direction} {{")
        if isolated:
            vmap = ", ".join(f"{ip} : jump {_chain(ip, direction)}" for ip in isolated)
            lines.append(f"    ip {field_} vmap {{ {vmap} }}")
        lines.append("  }")
        for ip in isolated:
            lines.append(f"  chain {_chain(ip, direction)} {{")
            lines += [f"    {r}" for r in dict.fromkeys(rules[direction][ip])]
            lines.append("    counter drop")
            lines.append("  }")
    lines += [
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        f"    ip saddr != {subnet} ip daddr != {subnet} return",
        "    ct state established,related accept",
        f"    ip saddr {subnet} ip saddr != {gateway} jump egress",
        f"    ip daddr {subnet} ip daddr != {gateway} jump ingress",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"
