"""Plan a sandbox: rendered Kubernetes objects -> pods to run on this host. Pure.

The sandbox plays the parts of the Kubernetes controllers and the kubelet for
the objects ``slurmk8s.render`` produces: StatefulSets and Deployments become
pods, Services become host names, ConfigMaps, Secrets, PVCs and emptyDirs
become files and directories mounted where the pod spec says.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Mapping, Sequence

from ..render.config import render_template

#: Where the images keep their entrypoint.
ENTRYPOINT = "/usr/local/bin/slurmk8s-entrypoint"
#: The bridge (host side) takes the first address of the subnet; pods follow.
GPU_MAJOR = 195


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


@dataclass
class SandboxPlan:
    cluster: str
    namespace: str
    cluster_domain: str
    subnet: str
    gateway: str
    pods: list[PodPlan]
    hosts: str
    claims: dict[str, str]  # claim name -> host directory (relative to the storage root)


def _component(image: str) -> str:
    """``ghcr.io/slurmk8s/slurmd:22.05`` -> ``slurmd``."""
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]


def _by_kind(objs: Iterable[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def _expand(objs: Sequence[dict]) -> list[tuple[str, dict, str | None]]:
    """(pod name, owning workload, subdomain) for each replica."""
    out = []
    for o in objs:
        kind, name, spec = o["kind"], o["metadata"]["name"], o.get("spec", {})
        if kind == "StatefulSet":
            for i in range(spec.get("replicas", 1)):
                out.append((f"{name}-{i}", o, spec.get("serviceName")))
        elif kind == "Deployment":
            for i in range(spec.get("replicas", 1)):
                out.append((f"{name}-{i}", o, None))
    return out


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


def _hosts(pods: Sequence[PodPlan], services: Mapping[str, dict], domain: str) -> str:
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


def plan(objs: Sequence[dict], *, subnet: str, user_keys: Mapping[str, str] = {}) -> SandboxPlan:
    """Plan the pods of a rendered cluster.

    ``user_keys`` maps login user names to extra authorized_keys text the
    sandbox supplies (so ``sandbox ssh`` can log in); Secrets the manifest
    refers to but does not render (``sshPublicKeysFrom``) are filled from it.
    """
    net = ipaddress.ip_network(subnet)
    hosts_iter = net.hosts()
    gateway = str(next(hosts_iter))
    config_maps = _by_kind(objs, "ConfigMap")
    secrets = dict(_by_kind(objs, "Secret"))
    services = _by_kind(objs, "Service")
    workloads = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")]
    first = workloads[0]["metadata"] if workloads else {"namespace": "default", "labels": {}}
    cluster = first.get("labels", {}).get("app.kubernetes.io/instance", "sandbox")
    namespace = first["namespace"]

    claims: dict[str, str] = {}
    for o in objs:
        if o["kind"] == "PersistentVolumeClaim":
            claims[o["metadata"]["name"]] = f"claims/{o['metadata']['name']}"

    pods: list[PodPlan] = []
    for pod_name, owner, subdomain in _expand(workloads):
        template = owner["spec"]["template"]
        spec = template["spec"]
        _supply_user_keys(spec, secrets, user_keys, namespace)
        sources, files = _volumes(pod_name, template, owner, config_maps, secrets, claims)
        gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in spec["containers"])
        pods.append(PodPlan(
            name=pod_name,
            namespace=owner["metadata"]["namespace"],
            owner_kind=owner["kind"],
            owner=owner["metadata"]["name"],
            labels=dict(template["metadata"].get("labels", {})),
            hostname=pod_name,
            subdomain=subdomain,
            ip=str(next(hosts_iter)),
            containers=[_container(c, sources) for c in spec["containers"]],
            files=files,
            gpus=gpus,
            termination_grace=spec.get("terminationGracePeriodSeconds", 30),
        ))
    domain = _cluster_domain(pods)
    return SandboxPlan(
        cluster=cluster,
        namespace=namespace,
        cluster_domain=domain,
        subnet=str(net),
        gateway=gateway,
        pods=pods,
        hosts=_hosts(pods, services, domain),
        claims=claims,
    )


def _cluster_domain(pods: Sequence[PodPlan]) -> str:
    for p in pods:
        addr = p.env.get("SLURMK8S_CONTROLLER", "")
        if ".svc." in addr:
            return addr.split(".svc.", 1)[1]
    return "cluster.local"


def _supply_user_keys(spec: dict, secrets: dict, user_keys: Mapping[str, str], namespace: str) -> None:
    """Stand in for Secrets the cluster would hold: ``sshPublicKeysFrom`` references."""
    for vol in spec.get("volumes", []):
        for src in vol.get("projected", {}).get("sources", []):
            ref = src["secret"]["name"]
            if ref in secrets:
                continue
            data = {}
            for item in src["secret"].get("items", []):
                text = user_keys.get(item["path"], "")
                data[item["key"]] = base64.b64encode(text.encode()).decode()
            secrets[ref] = {"metadata": {"name": ref, "namespace": namespace}, "data": data}


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


def hosts_file(pods: Sequence[PodPlan], services: Mapping[str, dict], domain: str = "cluster.local") -> str:
    """/etc/hosts for a sandbox whose pods come and go: pods and Services by their DNS names."""
    return _hosts(pods, services, domain)
