"""What the sandbox's kubelet runs for a Pod object, and its /etc/hosts. Pure.

``pod_plan`` turns a bound Pod (with the ConfigMaps and Secrets of its
namespace) into containers, mounts and files for the pod runtime:
ConfigMaps, Secrets and emptyDirs become files and directories, claims
become directories of the sandbox's storage, all mounted where the pod
spec says. ``hosts_file`` gives pods and Services their DNS names.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Mapping, Sequence

from ..render.config import render_template

#: Where the images keep their entrypoint.
ENTRYPOINT = "/usr/local/bin/slurmk8s-entrypoint"


@dataclass(frozen=True)
class Mount:
    """One entry of a pod's mount plan, applied in order inside its mount namespace."""

    kind: str  # bind | tmpfs | file (bind a single file) | dir (mkdir only)
    source: str  # host path, relative to the pod dir when it does not start with /
    target: str
    read_only: bool = False
    mode: str = ""


@dataclass(frozen=True)
class VolumeFile:
    """A file the sandbox writes into a pod's directory before it starts."""

    path: str  # relative to the pod dir
    content: bytes
    mode: int = 0o644


@dataclass
class ContainerPlan:
    """One container of a pod: its image (``images/<component>/``), command and mounts."""

    name: str
    component: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    readiness: list[str] | None = None  # exec probe argv
    tcp_ready_port: int | None = None
    http_ready: tuple[int, str] | None = None  # httpGet probe: (port, path)


@dataclass
class PodPlan:
    name: str
    namespace: str
    owner_kind: str
    owner: str
    labels: dict[str, str]
    hostname: str
    subdomain: str | None
    ip: str = ""
    containers: list[ContainerPlan] = field(default_factory=list)
    files: list[VolumeFile] = field(default_factory=list)
    gpus: int = 0
    termination_grace: int = 30

    @property
    def main(self) -> ContainerPlan:
        """The first container: it names the pod's component, and its end is the pod's."""
        return self.containers[0]

    @property
    def component(self) -> str:
        return self.main.component

    @property
    def env(self) -> dict[str, str]:
        return self.main.env

    @property
    def fqdn(self) -> str | None:
        return None if not self.subdomain else f"{self.hostname}.{self.subdomain}.{self.namespace}.svc"


def _component(image: str) -> str:
    """``ghcr.io/slurmk8s/slurmd:22.05`` -> ``slurmd``."""
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]


def _volumes(
    pod_name: str,
    template: dict,
    owner: dict,
    config_maps: Mapping[str, dict],
    secrets: Mapping[str, dict],
    claims: dict[str, str],
) -> tuple[dict[str, tuple[str, str]], list[VolumeFile]]:
    """Resolve the pod's volumes: {volume: (mount kind, source)} and the files to write."""
    spec = template["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for tpl in owner.get("spec", {}).get("volumeClaimTemplates", []):
        claim = f"{tpl['metadata']['name']}-{pod_name}"
        claims[claim] = f"claims/{claim}"
        volumes[tpl["metadata"]["name"]] = {"name": tpl["metadata"]["name"],
                                           "persistentVolumeClaim": {"claimName": claim}}
    used = {vm["name"] for c in spec["containers"] for vm in c.get("volumeMounts", [])}
    sources: dict[str, tuple[str, str]] = {}
    files: list[VolumeFile] = []
    for name in sorted(used):
        vol = volumes[name]
        local = f"volumes/{name}"
        if "configMap" in vol:
            data = config_maps[vol["configMap"]["name"]].get("data", {})
            files += [VolumeFile(f"{local}/{k}", v.encode()) for k, v in sorted(data.items())]
            sources[name] = ("bind", local)
        elif "secret" in vol:
            secret = secrets[vol["secret"]["secretName"]]
            mode = vol["secret"].get("defaultMode", 0o644)
            files += [VolumeFile(f"{local}/{k}", base64.b64decode(v), mode)
                      for k, v in sorted(secret.get("data", {}).items())]
            sources[name] = ("bind", local)
        elif "projected" in vol:
            mode = vol["projected"].get("defaultMode", 0o644)
            for src in vol["projected"]["sources"]:
                secret = secrets[src["secret"]["name"]]
                for item in src["secret"].get("items", []):
                    content = base64.b64decode(secret["data"][item["key"]])
                    files.append(VolumeFile(f"{local}/{item['path']}", content, mode))
            sources[name] = ("bind", local)
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            claims.setdefault(claim, f"claims/{claim}")
            sources[name] = ("bind", "/" + claims[claim])
        elif "emptyDir" in vol:
            if vol["emptyDir"].get("medium") == "Memory":
                sources[name] = ("tmpfs", "tmpfs")
            else:
                sources[name] = ("bind", local)
                files.append(VolumeFile(f"{local}/.keep", b""))
        else:
            raise ValueError(f"pod {pod_name}: volume {name} has a type the sandbox does not run")
    return sources, files


def _container(container: dict, sources: Mapping[str, tuple[str, str]]) -> ContainerPlan:
    mounts = []
    for vm in sorted(container.get("volumeMounts", []), key=lambda m: PurePosixPath(m["mountPath"]).parts):
        kind, source = sources[vm["name"]]
        mounts.append(Mount(kind, source, vm["mountPath"], read_only=bool(vm.get("readOnly")),
                            mode="1777" if kind == "tmpfs" else ""))
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}

    def port(value):
        return value if isinstance(value, int) else ports[value]

    probe = container.get("readinessProbe", {})
    return ContainerPlan(
        name=container["name"],
        component=_component(container["image"]),
        env={e["name"]: e["value"] for e in container.get("env", [])},
        args=list(container.get("command", [])[1:] + container.get("args", [])),
        mounts=mounts,
        readiness=probe.get("exec", {}).get("command"),
        tcp_ready_port=port(probe["tcpSocket"]["port"]) if "tcpSocket" in probe else None,
        http_ready=(port(probe["httpGet"]["port"]), probe["httpGet"].get("path", "/")) if "httpGet" in probe else None,
    )


def hosts_file(pods: Sequence[PodPlan], services: Mapping[str, dict], domain: str = "cluster.local") -> str:
    """/etc/hosts for every pod: pods by name and FQDN, Services by their DNS names."""
    entries: list[tuple[str, list[str]]] = []
    for p in pods:
        names = [p.hostname]
        if p.fqdn:
            names = [f"{p.fqdn}.{domain}", p.fqdn, f"{p.hostname}.{p.subdomain}", p.hostname]
        entries.append((p.ip, names))
    for _, svc in sorted(services.items()):
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        selector = svc["spec"].get("selector")
        members = [p for p in pods if selector and p.namespace in ("", ns)
                   and all(p.labels.get(k) == v for k, v in selector.items())]
        if not members:
            continue
        names = [f"{name}.{ns}.svc.{domain}", f"{name}.{ns}.svc", f"{name}.{ns}", name]
        entries += [(m.ip, names) for m in members]
    return render_template("hosts", entries=entries)


def pod_plan(pod: dict, config_maps: Mapping[str, dict], secrets: Mapping[str, dict], ip: str) -> PodPlan:
    """One bound Pod object (as the API serves it) -> what the runtime runs. Pure.

    ``config_maps`` and ``secrets`` are the objects of the pod's namespace, by
    name; a persistent volume claim becomes ``/claims/<namespace>/<claim>``.
    Raises ``LookupError`` naming a ConfigMap or Secret that does not exist
    (yet): the kubelet waits for it, as Kubernetes does.
    """
    meta, spec = pod["metadata"], pod["spec"]
    ns = meta.get("namespace", "default")
    for vol in spec.get("volumes", []):
        for kind, ref, store in (("configMap", "name", config_maps), ("secret", "secretName", secrets)):
            if kind in vol and vol[kind][ref] not in store and not vol[kind].get("optional"):
                raise LookupError(f"{kind} {ns}/{vol[kind][ref]} (volume {vol['name']}) does not exist")
        for src in vol.get("projected", {}).get("sources", []):
            if "secret" in src and src["secret"]["name"] not in secrets:
                raise LookupError(f"secret {ns}/{src['secret']['name']} (volume {vol['name']}) does not exist")
    claims = {v["persistentVolumeClaim"]["claimName"]: f"claims/{ns}/{v['persistentVolumeClaim']['claimName']}"
              for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
    sources, files = _volumes(meta["name"], pod, {}, config_maps, secrets, claims)
    gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in spec["containers"])
    owner = next((o for o in meta.get("ownerReferences", []) if o.get("controller")), {})
    return PodPlan(
        name=meta["name"],
        namespace=ns,
        owner_kind=owner.get("kind", ""),
        owner=owner.get("name", ""),
        labels=dict(meta.get("labels", {})),
        hostname=spec.get("hostname") or meta["name"],
        subdomain=spec.get("subdomain"),
        ip=ip,
        containers=[_container(c, sources) for c in spec["containers"]],
        files=files,
        gpus=gpus,
        termination_grace=spec.get("terminationGracePeriodSeconds", 30),
    )

