"""What the sandbox's kubelet runs for a Pod object, and its /etc/hosts. Pure.

``pod_plan`` turns a bound Pod (with the ConfigMaps and Secrets of its
namespace) into containers, mounts and files for the pod runtime:
ConfigMaps, Secrets and emptyDirs become files and directories, claims
become directories of the sandbox's storage, all mounted where the pod
spec says. ``hosts_file`` gives pods and Services their DNS names.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from slurmk8s.render.config import render_template

from .apiserver.quantity import parse as parse_quantity


@dataclass(frozen=True)
class Mount:
    """One entry of a pod's mount plan, applied in order inside its mount namespace."""

    kind: str  # bind | tmpfs | file (bind a single file) | dir (mkdir only)
    source: str  # host path, relative to the pod dir when it does not start with /
    target: str
    read_only: bool = False
    mode: str = ""
    size: int | None = None  # tmpfs: bytes (an emptyDir's sizeLimit)


@dataclass(frozen=True)
class VolumeFile:
    """A file the sandbox writes into a pod's directory before it starts."""

    path: str  # relative to the pod dir
    content: bytes
    mode: int = 0o644
    #: An empty directory (an emptyDir), not a file: made 0777 as the kubelet makes them.
    directory: bool = False


@dataclass
class ContainerPlan:
    """One container of a pod: its image, command, environment, mounts and probes."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    readiness: list[str] | None = None  # exec probe argv
    tcp_ready_port: int | None = None
    http_ready: tuple[int, str] | None = None  # httpGet probe: (port, path)
    # The image reference, the container's own command and args (None: unset,
    # the image's Entrypoint and Cmd apply), its securityContext over the
    # pod's, and its resources.
    image: str = ""
    command: list[str] | None = None
    container_args: list[str] | None = None
    security: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    #: imagePullPolicy as written (None: Kubernetes' default for the reference, sandbox.pulls).
    pull_policy: str | None = None


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
    #: The Secrets of spec.imagePullSecrets, as read (a missing one is left out, as a kubelet does).
    pull_secrets: list[dict] = field(default_factory=list)
    #: spec.securityContext.fsGroup: the group of its volumes' files, which it may read.
    fs_group: int | None = None

    @property
    def main(self) -> ContainerPlan:
        """The first container: its end is the pod's."""
        return self.containers[0]

    @property
    def env(self) -> dict[str, str]:
        return self.main.env

    @property
    def fqdn(self) -> str | None:
        return None if not self.subdomain else f"{self.hostname}.{self.subdomain}.{self.namespace}.svc"


def _volumes(
    pod_name: str,
    template: dict,
    owner: dict,
    config_maps: Mapping[str, dict],
    secrets: Mapping[str, dict],
    claims: dict[str, str],
    tokens: Mapping[tuple[str, str], str],
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
            data = config_maps.get(vol["configMap"]["name"], {}).get("data", {})  # optional and missing: empty
            files += [VolumeFile(f"{local}/{k}", v.encode()) for k, v in sorted(data.items())]
            sources[name] = ("bind", local)
        elif "secret" in vol:
            secret = secrets.get(vol["secret"]["secretName"], {})  # optional and missing: empty
            mode = vol["secret"].get("defaultMode", 0o644)
            files += [VolumeFile(f"{local}/{k}", base64.b64decode(v), mode)
                      for k, v in sorted(secret.get("data", {}).items())]
            sources[name] = ("bind", local)
        elif "projected" in vol:
            mode = vol["projected"].get("defaultMode", 0o644)
            for src in vol["projected"]["sources"]:
                if "secret" in src:
                    secret = secrets.get(src["secret"]["name"], {})
                    data = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
                    files += _items(local, data, src["secret"].get("items"), mode)
                elif "configMap" in src:
                    data = {k: v.encode() for k, v in config_maps.get(src["configMap"]["name"], {}).get("data", {}).items()}
                    files += _items(local, data, src["configMap"].get("items"), mode)
                elif "downwardAPI" in src:
                    files += [VolumeFile(f"{local}/{i['path']}", _field(template, i["fieldRef"]["fieldPath"], "").encode(),
                                         mode) for i in src["downwardAPI"].get("items", [])]
                elif "serviceAccountToken" in src:
                    path = src["serviceAccountToken"]["path"]
                    files.append(VolumeFile(f"{local}/{path}", tokens[(name, path)].encode(), mode))
            sources[name] = ("bind", local)
        elif "downwardAPI" in vol:
            mode = vol["downwardAPI"].get("defaultMode", 0o644)
            files += [VolumeFile(f"{local}/{i['path']}", _field(template, i["fieldRef"]["fieldPath"], "").encode(), mode)
                      for i in vol["downwardAPI"].get("items", [])]
            sources[name] = ("bind", local)
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            claims.setdefault(claim, f"claims/{claim}")
            sources[name] = ("bind", "/" + claims[claim])
        elif "hostPath" in vol:
            path = vol["hostPath"]["path"]
            if not path.startswith("/"):
                raise ValueError(f"pod {pod_name}: hostPath {path!r} of volume {name} is not an absolute path")
            sources[name] = ("bind", path)
        elif "emptyDir" in vol:
            if vol["emptyDir"].get("medium") == "Memory":
                limit = vol["emptyDir"].get("sizeLimit")
                sources[name] = ("tmpfs", f"tmpfs:{int(parse_quantity(limit))}" if limit else "tmpfs")
            else:
                sources[name] = ("bind", local)
                files.append(VolumeFile(local, b"", 0o777, directory=True))
        else:
            raise ValueError(f"pod {pod_name}: volume {name} has a type the sandbox does not run")
    return sources, files


def _items(local: str, data: Mapping[str, bytes], items: list[dict] | None, mode: int) -> list[VolumeFile]:
    """The files of a ConfigMap or Secret projection: every key, or the ``items`` chosen (key -> path)."""
    if items is None:
        return [VolumeFile(f"{local}/{k}", v, mode) for k, v in sorted(data.items())]
    return [VolumeFile(f"{local}/{i['path']}", data[i["key"]], i.get("mode", mode)) for i in items]


def _field(pod: dict, path: str, ip: str) -> str:
    """A downward-API ``fieldRef`` of the pod, as the kubelet resolves it."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""), "status.podIP": ip, "status.podIPs": ip,
        "status.hostIP": "", "status.hostIPs": "",
    }
    if path in simple:
        return simple[path]
    for prefix, values in (("metadata.labels", meta.get("labels") or {}),
                           ("metadata.annotations", meta.get("annotations") or {})):
        if path == prefix:
            return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
        if path.startswith(prefix + "['") and path.endswith("']"):
            return values.get(path[len(prefix) + 2:-2], "")
    raise ValueError(f"pod {meta.get('name')}: fieldRef {path!r} is not supported")


def _env(container: dict, pod: dict, ip: str, config_maps: Mapping[str, dict], secrets: Mapping[str, dict],
         service_env: Mapping[str, str]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: the Service variables
    (KUBERNETES_SERVICE_HOST ...), then ``envFrom``, then ``env`` with ``valueFrom``
    resolved. A missing ConfigMap, Secret or key that is not optional is a
    ``LookupError``: the kubelet waits for it (CreateContainerConfigError)."""
    ns = pod["metadata"].get("namespace", "default")

    def source(kind: str, ref: dict) -> dict[str, str] | None:
        store = config_maps if kind == "configMap" else secrets
        obj = store.get(ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                return None
            raise LookupError(f"{kind} {ns}/{ref.get('name')} does not exist")
        data = obj.get("data") or {}
        return dict(data) if kind == "configMap" else {k: base64.b64decode(v).decode() for k, v in data.items()}

    env = dict(service_env)
    for ef in container.get("envFrom", []):
        for kind, key in (("configMap", "configMapRef"), ("secret", "secretRef")):
            if key in ef:
                env.update({ef.get("prefix", "") + k: v for k, v in (source(kind, ef[key]) or {}).items()})
    for e in container.get("env", []):
        value_from = e.get("valueFrom")
        if value_from is None:
            env[e["name"]] = e.get("value", "")
        elif "fieldRef" in value_from:
            env[e["name"]] = _field(pod, value_from["fieldRef"]["fieldPath"], ip)
        elif "resourceFieldRef" in value_from:
            ref = value_from["resourceFieldRef"]
            kind, _, res = ref["resource"].partition(".")
            env[e["name"]] = str((container.get("resources", {}).get(kind, {}) or {}).get(res, ""))
        else:
            kind, key = ("configMap", "configMapKeyRef") if "configMapKeyRef" in value_from else ("secret", "secretKeyRef")
            ref = value_from[key]
            data = source(kind, ref)
            if data is None:
                continue
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise LookupError(f"{kind} {ns}/{ref['name']} has no key {ref['key']!r}")
            env[e["name"]] = data[ref["key"]]
    return env


def token_requests(pod: dict) -> list[tuple[str, str, str | None, int]]:
    """The ServiceAccount tokens a pod's projected volumes ask for:
    (volume, path, audience or None, expirationSeconds). The kubelet requests
    them (TokenRequest) before it plans the pod. Pure."""
    out = []
    for vol in pod["spec"].get("volumes", []):
        for src in (vol.get("projected") or {}).get("sources", []):
            tok = src.get("serviceAccountToken")
            if tok is not None:
                out.append((vol["name"], tok["path"], tok.get("audience"), int(tok.get("expirationSeconds", 3600))))
    return out


def _container(container: dict, sources: Mapping[str, tuple[str, str]], env: dict[str, str],
               pod_security: Mapping | None = None) -> ContainerPlan:
    mounts = []
    for vm in sorted(container.get("volumeMounts", []), key=lambda m: PurePosixPath(m["mountPath"]).parts):
        kind, source = sources[vm["name"]]
        size = None
        if kind == "tmpfs" and source.startswith("tmpfs:"):
            source, size = "tmpfs", int(source.split(":", 1)[1])
        mounts.append(Mount(kind, source, vm["mountPath"], read_only=bool(vm.get("readOnly")),
                            mode="1777" if kind == "tmpfs" else "", size=size))
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}

    def port(value):
        return value if isinstance(value, int) else ports[value]

    probe = container.get("readinessProbe", {})
    return ContainerPlan(
        name=container["name"],
        env=env,
        mounts=mounts,
        readiness=probe.get("exec", {}).get("command"),
        tcp_ready_port=port(probe["tcpSocket"]["port"]) if "tcpSocket" in probe else None,
        http_ready=(port(probe["httpGet"]["port"]), probe["httpGet"].get("path", "/")) if "httpGet" in probe else None,
        image=container["image"],
        pull_policy=container.get("imagePullPolicy"),
        command=list(container["command"]) if container.get("command") else None,
        container_args=list(container["args"]) if container.get("args") else None,
        security=security_context(pod_security or {}, container.get("securityContext") or {}),
        resources=dict(container.get("resources") or {}),
    )


#: The fields of a PodSecurityContext that a container's securityContext also has (and overrides).
_SHARED_SECURITY = ("runAsUser", "runAsGroup", "runAsNonRoot", "seLinuxOptions", "seccompProfile",
                    "windowsOptions", "appArmorProfile")


def security_context(pod: Mapping, container: Mapping) -> dict:
    """A container's effective securityContext: the pod's shared fields, the
    container's over them; ``supplementalGroups`` and ``fsGroup`` from the pod."""
    out = {k: pod[k] for k in _SHARED_SECURITY if k in pod}
    out.update(container)
    for k in ("supplementalGroups", "fsGroup"):
        if k in pod:
            out[k] = pod[k]
    return out


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


def pod_plan(pod: dict, config_maps: Mapping[str, dict], secrets: Mapping[str, dict], ip: str,
             tokens: Mapping[tuple[str, str], str] | None = None,
             service_env: Mapping[str, str] | None = None) -> PodPlan:
    """One bound Pod object (as the API serves it) -> what the runtime runs. Pure.

    ``config_maps`` and ``secrets`` are the objects of the pod's namespace, by
    name; a persistent volume claim becomes ``/claims/<namespace>/<claim>``.
    ``tokens`` holds the ServiceAccount tokens the kubelet requested for the
    pod's projected volumes, by (volume, path) (``token_requests``);
    ``service_env`` the Service variables every container gets
    (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT, ...).
    Raises ``LookupError`` naming a ConfigMap, Secret, key or token that does
    not exist (yet): the kubelet waits for it, as Kubernetes does.
    """
    meta, spec = pod["metadata"], pod["spec"]
    ns = meta.get("namespace", "default")
    for vol in spec.get("volumes", []):
        for kind, ref, store in (("configMap", "name", config_maps), ("secret", "secretName", secrets)):
            if kind in vol and vol[kind][ref] not in store and not vol[kind].get("optional"):
                raise LookupError(f"{kind} {ns}/{vol[kind][ref]} (volume {vol['name']}) does not exist")
        for src in vol.get("projected", {}).get("sources", []):
            for kind, store in (("secret", secrets), ("configMap", config_maps)):
                if kind in src and src[kind]["name"] not in store and not src[kind].get("optional"):
                    raise LookupError(f"{kind} {ns}/{src[kind]['name']} (volume {vol['name']}) does not exist")
    claims = {v["persistentVolumeClaim"]["claimName"]: f"claims/{ns}/{v['persistentVolumeClaim']['claimName']}"
              for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
    tokens = tokens or {}
    for vol, path, _, _ in token_requests(pod):
        if (vol, path) not in tokens:
            raise LookupError(f"no ServiceAccount token for volume {vol} ({path}) yet")
    sources, files = _volumes(meta["name"], pod, {}, config_maps, secrets, claims, tokens)
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
        containers=[_container(c, sources, _env(c, pod, ip, config_maps, secrets, service_env or {}),
                               spec.get("securityContext"))
                    for c in spec["containers"]],
        files=files,
        gpus=gpus,
        termination_grace=spec.get("terminationGracePeriodSeconds", 30),
        pull_secrets=[secrets[r["name"]] for r in spec.get("imagePullSecrets") or []
                      if r.get("name") in secrets],
        fs_group=(spec.get("securityContext") or {}).get("fsGroup"),
    )

