"""Addresses and ports the spec names: addresses (:data:`IpAddress`), address blocks
(:data:`Cidr`), srun's port range (:data:`PortRange`), and the host a password may be
sent to (:func:`credential_host`). Pure; re-exported by :mod:`.fields`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator

from .refusals import pattern_check, refuse, schema_pattern

__all__ = ["IpAddress", "Cidr", "PortRange", "PORT_RANGE_MIN", "credential_host", "ipv4_literal", "egress_blocks"]


PORT_RANGE_RE = r"[0-9]{4,5}-[0-9]{4,5}"
#: Ports srun listens on, for slurmstepd and slurmctld to call back: at least 100 of them (each
#: srun takes a few), above the privileged ports, within 1024-65535.
PORT_RANGE_MIN = 100


def _port_range(value: str) -> str:
    pattern_check(PORT_RANGE_RE, "use FIRST-LAST, e.g. 60001-63000", 11)(value)
    first, last = (int(v) for v in value.split("-"))
    if not 1024 <= first <= last <= 65535:
        raise refuse(value, "must lie within 1024-65535, the first port not above the last")
    if last - first + 1 < PORT_RANGE_MIN:
        raise refuse(value, f"holds {last - first + 1} ports; srun needs a few for each step, give at least {PORT_RANGE_MIN}")
    return value


#: A range of TCP ports, ``FIRST-LAST``, as slurm.conf's SrunPortRange takes it.
PortRange = Annotated[str, AfterValidator(_port_range), schema_pattern(f"^{PORT_RANGE_RE}$", 11)]


def _ip_address(value: str) -> str:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise refuse(value, "is not an IP address such as 10.96.0.10 or fd00::a") from None
    if str(address) != value:
        raise refuse(value, f"is not written as the address is: write {address}")
    return value


#: An IPv4 or IPv6 address, as the address writes itself (``10.96.0.10``, ``fd00::a``).
IpAddress = Annotated[str, AfterValidator(_ip_address), schema_pattern(r"^[0-9a-fA-F:.]+$", 39)]


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise refuse(value, f"is not an address block such as 10.0.0.0/8 or 192.0.2.7/32 ({exc})") from None
    return str(net)


#: An IPv4 or IPv6 address block in CIDR notation, host bits clear: ``10.20.0.0/16``.
Cidr = Annotated[str, AfterValidator(_cidr), schema_pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$", 43)]


#: What inet_aton (and so the database client) reads as an IPv4 address:
#: 1 to 4 parts, each decimal, octal (0...) or hex (0x...): 2852039166 and
#: 0251.0376.0251.0376 are both 169.254.169.254.
_INET_ATON_RE = r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}"


def credential_host(value: str) -> str:
    """A host name, or an IPv4 address in dotted-decimal form that is not
    loopback, link-local (cloud metadata services), unspecified, multicast or
    reserved: a password (the database's, the directory's bind password) is
    sent there."""
    if value == "localhost" or value.endswith(".localhost"):
        raise refuse(value, "is this pod itself (loopback); name the service's host")
    if not re.fullmatch(_INET_ATON_RE, value):
        return value
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise refuse(value, "is an IPv4 address in a form other than a.b.c.d (decimal, octal or hex "
                     "parts hide which host it is); write it as four decimal numbers") from None
    for bad, why in (("is_loopback", "a loopback"), ("is_link_local", "a link-local (cloud metadata services)"),
                     ("is_unspecified", "the unspecified"), ("is_multicast", "a multicast"),
                     ("is_reserved", "a reserved")):
        if getattr(address, bad):
            raise refuse(value, f"is {why} address; a password may only go to the service's own host")
    return value


def ipv4_literal(host: str) -> bool:
    """Whether ``host`` is an IPv4 address written a.b.c.d (as :func:`credential_host`
    lets one through), not a name."""
    return re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", host) is not None


def egress_blocks(hosts: list[str], cidrs: list[str]) -> list[str]:
    """The address blocks an egress rule may send to for servers named by ``hosts``:
    each IPv4 address alone and ``cidrs``, each once (a NetworkPolicy admits
    addresses, not names)."""
    return list(dict.fromkeys([*(f"{h}/32" for h in hosts if ipv4_literal(h)), *cidrs]))
