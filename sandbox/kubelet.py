"""The sandbox's kubelet: runs the pods an API server binds to the sandbox's
Nodes, with the pod runtime, and reports them back through the API.

Over 500 lines because it is one loop (register, admit, start, tend, report,
stop) over one state file; the runtime, the pod plan, the logs and the
kubelet's HTTPS API are modules of their own already.

What a kubelet does, for the objects slurmk8s uses:
- registers its Nodes (capacity, labels, taints) and keeps their Ready
  condition fresh;
- starts a bound pod once its ConfigMaps and Secrets exist: an address on
  the sandbox bridge, the containers through their images' entrypoints, and
  status (phase, podIP, conditions, containerStatuses);
- runs readiness probes and reports Ready as it changes;
- keeps ConfigMap and Secret volumes in step with the API, as Kubernetes
  does (here within seconds), and /etc/hosts with the pods and Services;
- on graceful deletion stops the pod (SIGTERM, SIGKILL after the grace
  period) and then removes the object; a pod whose containers ended is
  restarted in place when its restartPolicy says so.

Everything it starts is written to ``kubelet.json`` first, so a kubelet that
is killed and started again adopts the pods still running and stops those
the API no longer has.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import gpus, runcruntime, runtime
from .distribution import Pulled, PullError
from .kubeletserver import KubeletServer
from .netpolwatch import PolicyAgent, wake_on_changes
from .plan import PodPlan, hosts_file, pod_plan, token_requests
from .pulls import NodeImages, pull_secret_auths

Progress = Callable[[str], None]
GPU = "nvidia.com/gpu"
#: The nodes' registry configuration in the kubelet's directory (sandbox.pulls.NodeRegistries).
REGISTRIES_FILE = "registries.json"
#: Where the nodes keep pulled blobs and images, by digest: one store for this host's nodes, as
#: one containerd's (which reference named which digest is each sandbox's: <state>/images).
IMAGE_CACHE_ENV = "SLURMK8S_KUBELET_IMAGES"
DEFAULT_IMAGE_CACHE = Path("/var/cache/slurmk8s/kubelet-images")


def image_cache() -> Path:
    return Path(os.environ.get(IMAGE_CACHE_ENV) or DEFAULT_IMAGE_CACHE)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class SandboxNode:
    """A Kubernetes Node the sandbox serves. All share this host's CPUs; the
    numbers are what the scheduler counts."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    gpu_product: str = "h100"
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)

    def object(self) -> dict:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "node.slurmk8s.dev/sandbox": "true", **self.labels}
        if self.gpus:
            capacity[GPU] = str(self.gpus)
            labels.setdefault("nvidia.com/gpu.product", self.gpu_product)
            labels.setdefault("nvidia.com/gpu.count", str(self.gpus))
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": labels},
                "spec": {"taints": list(self.taints)} if self.taints else {},
                "status": {"capacity": capacity, "allocatable": capacity}}


@dataclass
class LocalPod:
    """A pod this kubelet runs, as kubelet.json records it."""

    uid: str
    namespace: str
    name: str
    node: str
    index: int  # veth number
    ip: str
    holder: int | None = None
    restarts: int = 0
    started: str = ""
    ready: bool = False
    volumes: str = ""  # hash of the ConfigMap/Secret files last written
    waiting: str = ""  # why its containers could not start (ErrImagePull, ...); "" once they run
    attempts: int = 0  # failed starts in a row: the back-off grows with them
    retry_at: float = 0.0  # wall-clock time of the next start when waiting
    #: The host numbers of the node's GPUs the pod holds (sandbox.gpus), from admission until it is gone.
    gpus: list[int] = field(default_factory=list)
    #: containerStatuses[].imageID of each container: the repository pulled from, at its digest.
    image_ids: list[str] = field(default_factory=list)


class Kubelet:
    def __init__(self, api: client.ApiClient, nodes: list[SandboxNode], state_dir: Path,
                 network: runtime.Network, progress: Progress = lambda _: None, images: NodeImages | None = None):
        self.core = client.CoreV1Api(api)
        self.nodes = {n.name: n for n in nodes}
        self.dir = state_dir
        #: The node's images, pulled from registries (its configuration: registries.json beside kubelet.json).
        self.images = images or NodeImages(image_cache(), state_dir / REGISTRIES_FILE, state_dir / "images")
        self.net = network
        self.progress = progress
        self.pods: dict[str, LocalPod] = {}
        self.stopping: set[str] = set()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet-stop")
        self._hosts = ""
        self._heartbeat = 0.0
        self._probed: dict[str, float] = {}
        #: Pods whose last step failed: uid -> when to try again.
        self._failed: dict[str, float] = {}
        self._round_objects: dict[str, tuple[dict, dict]] = {}
        self._service_env: dict[str, str] | None = None
        #: ServiceAccount tokens of projected volumes: pod uid -> (volume, path) -> (token, renew at).
        self._tokens: dict[str, dict[tuple[str, str], tuple[str, float]]] = {}
        #: Set once the first round after start has reported every pod: a
        #: pod the API shows Ready from before then is not known to be.
        self.synced = False
        self._load()

    # State

    @property
    def state_file(self) -> Path:
        return self.dir / "kubelet.json"

    @property
    def hosts_path(self) -> Path:
        return self.dir / "hosts"

    def _load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.state_file.exists():
            data = json.loads(self.state_file.read_text())
            self.pods = {uid: LocalPod(**p) for uid, p in data["pods"].items()}
        if not self.hosts_path.exists():
            self.hosts_path.write_text("127.0.0.1 localhost\n")

    def _save(self) -> None:
        with self.lock:
            data = {"pods": {uid: asdict(p) for uid, p in self.pods.items()},
                    "pid": os.getpid(), "synced": self.synced}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.state_file)

    def pod_dir(self, p: LocalPod) -> Path:
        return self.dir / "pods" / f"{p.namespace}_{p.name}_{p.uid[:8]}"

    @staticmethod
    def _netns_key(p: LocalPod) -> str:
        return f"{p.name[:40]}-{p.uid[:8]}"

    def _free_address(self) -> tuple[int, str]:
        net = ipaddress.ip_network(self.net.subnet)
        taken = {p.ip for p in self.pods.values()} | {self.net.gateway}
        used = {p.index for p in self.pods.values()}
        index = next(i for i in range(len(used) + 1) if i not in used)
        ip = next(str(h) for h in net.hosts() if str(h) not in taken)
        return index, ip

    # The loop

    def run(self, stop: threading.Event, period: float = 0.5, settle: float = 0.02) -> None:
        """Sync every ``period`` seconds (probes, restarts, volumes), and
        ``settle`` seconds after a watched change to a pod bound to one of
        its Nodes, as a kubelet acts on its pod watch."""
        # Its API (logs, exec) until `stop` is set; the Nodes say where it listens.
        self.server = KubeletServer(self, self.core.api_client.configuration.ssl_ca_cert, self.dir / "pki").start(stop)
        self.register_nodes()
        wake = threading.Event()
        threading.Thread(target=self._watch_pods, args=(stop, wake), name="kubelet-watch", daemon=True).start()
        while not stop.is_set():
            try:
                self.sync()
                if not self.synced:
                    self.synced = True
                    self._save()
            except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:  # the API server restarting: try again
                self.progress(f"kubelet: {exc}")
            if wake.wait(period):
                wake.clear()
                stop.wait(settle)  # a burst of events makes one sync

    def _watch_pods(self, stop: threading.Event, wake: threading.Event) -> None:
        """Set ``wake`` when a pod bound to one of its Nodes is added, changed
        or deleted. The loop's own period stays the resync, so a watch that
        breaks (the API server restarting) costs latency, not correctness."""
        def bound_here(pod) -> bool:
            spec = getattr(pod, "spec", None)
            return spec is not None and spec.node_name in self.nodes

        wake_on_changes(self.core.list_pod_for_all_namespaces, stop, wake, bound_here)

    def _forget_stale_readiness(self, bound: dict[str, dict]) -> None:
        """Pods the API shows Ready that this kubelet does not run (the
        sandbox stopped and started again, or a pod's processes died while no
        kubelet watched): not Ready until their probes pass again, as a
        kubelet reports after a node restarts."""
        for uid, pod in bound.items():
            local = self.pods.get(uid)
            if local is not None and runtime.alive(local.holder):
                continue
            conditions = {c.get("type"): c.get("status") for c in pod.get("status", {}).get("conditions", [])}
            if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
                stamp = now()
                self._status(pod["metadata"], {"conditions": [
                    {"type": "ContainersReady", "status": "False", "reason": "KubeletRestarted",
                     "lastTransitionTime": stamp},
                    {"type": "Ready", "status": "False", "reason": "KubeletRestarted", "lastTransitionTime": stamp,
                     "message": "the kubelet has not run this pod's readiness probe since it started"}]})

    def register_nodes(self) -> None:
        for node in self.nodes.values():
            obj = node.object()
            try:
                self.core.create_node(obj)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self.core.patch_node(node.name, {"metadata": {"labels": obj["metadata"]["labels"]}})
            self.core.patch_node_status(node.name, {"status": {**obj["status"], **self.server.node_status()}})
        self._heartbeat = 0.0

    def _heartbeats(self) -> None:
        if time.monotonic() - self._heartbeat < 10:
            return
        self._heartbeat = time.monotonic()
        stamp = now()
        for name in self.nodes:
            self.core.patch_node_status(name, {"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "slurmk8s sandbox kubelet is posting ready status",
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
                "addresses": [{"type": "InternalIP", "address": self.net.gateway},
                              {"type": "Hostname", "address": name}]}})

    def sync(self) -> None:
        self._round_objects = {}
        self._service_env = None
        self._heartbeats()
        bound = {}
        for name in self.nodes:
            for pod in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
                bound[pod.metadata.uid] = self.core.api_client.sanitize_for_serialization(pod)
        if not self.synced:
            self._forget_stale_readiness(bound)
        for uid, local in list(self.pods.items()):
            if uid not in bound and uid not in self.stopping:
                self._stop(local, grace=0, delete=False)
                self._tokens.pop(uid, None)
        for uid, pod in bound.items():
            meta, status = pod["metadata"], pod.get("status", {})
            local = self.pods.get(uid)
            if meta.get("deletionTimestamp"):
                if uid not in self.stopping:
                    if local is None:
                        self._delete(meta)
                    else:
                        self._stop(local, grace=int(meta.get("deletionGracePeriodSeconds") or 0), delete=True)
                continue
            if local is None:
                # New, or left from before this host's pods went away (a
                # sandbox stopped and started again): run it, as a kubelet
                # does after a reboot. Finished pods stay finished.
                if status.get("phase") not in ("Succeeded", "Failed"):
                    self._isolated(pod, self._admit, pod)
                continue
            if uid in self.stopping:
                continue
            self._isolated(pod, self._tend, pod, local)
        self._write_hosts(bound)

    # Pods

    def _isolated(self, pod: dict, step, *args) -> None:
        """One pod's step; what goes wrong with it is that pod's (a waiting
        reason and an Event), never the end of the kubelet's loop."""
        meta = pod["metadata"]
        if time.time() < self._failed.get(meta["uid"], 0.0):
            return
        try:
            step(*args)
        except (runtime.SandboxError, ValueError, KeyError) as exc:
            local = self.pods.get(meta["uid"])
            self.progress(f"kubelet: pod {meta['namespace']}/{meta['name']}: {exc}")
            names = [c["name"] for c in pod["spec"]["containers"]]
            if local is not None:
                self._waiting(local, names, "CreateContainerError", str(exc), "Failed")
                self._failed[meta["uid"]] = local.retry_at
            else:  # its plan failed: nothing of it exists; try again in a while
                self._failed[meta["uid"]] = time.time() + 30
                self._status(meta, {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": str(exc)}],
                    "containerStatuses": [{"name": n, "ready": False, "restartCount": 0, "started": False,
                                           "image": "", "imageID": "", "state": {"waiting": {
                                               "reason": "CreateContainerConfigError", "message": str(exc)}}}
                                          for n in names]})
                self._event(meta, "Warning", "Failed", str(exc))
        else:
            self._failed.pop(meta["uid"], None)

    def _waiting(self, local: LocalPod, containers: list[str], reason: str, message: str, event: str) -> None:
        """The pod's containers could not start: report why, with an Event,
        and try again after a back-off (10 s, doubling up to 5 minutes)."""
        local.holder = None
        local.ready = False
        local.attempts += 1
        local.waiting = reason
        local.retry_at = time.time() + min(300, 10 * 2 ** (local.attempts - 1))
        self._save()
        meta = {"name": local.name, "namespace": local.namespace, "uid": local.uid}
        self._status(meta, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": message}],
            "containerStatuses": [{"name": n, "ready": False, "restartCount": local.restarts, "started": False,
                                   "image": "", "imageID": "",
                                   "state": {"waiting": {"reason": reason, "message": message}}}
                                  for n in containers]})
        self._event(meta, "Warning", event, message)

    def _event(self, meta: dict, kind: str, reason: str, message: str) -> None:
        stamp = now()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], **({"uid": meta["uid"]} if "uid" in meta else {})},
                "reason": reason, "message": message, "type": kind, "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp,
                "source": {"component": "kubelet", "host": next(iter(self.nodes), "")}}
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as exc:
            self.progress(f"kubelet: could not record an Event for {meta['namespace']}/{meta['name']}: "
                          f"{exc.status} {exc.reason}")

    def _namespace_objects(self, ns: str) -> tuple[dict, dict]:
        """The ConfigMaps and Secrets of ``ns``, read once per round however many pods need them."""
        if ns not in self._round_objects:
            ser = self.core.api_client.sanitize_for_serialization
            cms = {o.metadata.name: ser(o) for o in self.core.list_namespaced_config_map(ns).items}
            secrets = {o.metadata.name: ser(o) for o in self.core.list_namespaced_secret(ns).items}
            self._round_objects[ns] = (cms, secrets)
        return self._round_objects[ns]

    def _plan(self, pod: dict, ip: str) -> PodPlan:
        cms, secrets = self._namespace_objects(pod["metadata"]["namespace"])
        return pod_plan(pod, cms, secrets, ip, self._pod_tokens(pod), self._kubernetes_env())

    def _kubernetes_env(self) -> dict[str, str]:
        """KUBERNETES_SERVICE_HOST/PORT for every container, from the
        ``kubernetes`` Service's endpoints in ``default``. A real kubelet gives
        the Service's cluster IP, which kube-proxy routes; the sandbox routes
        no cluster IPs, so it gives the endpoint (the API server's address on
        the pods' network) itself."""
        if self._service_env is None:
            try:
                ep = self.core.read_namespaced_endpoints("kubernetes", "default")
                subset = (ep.subsets or [])[0]
                host, port = subset.addresses[0].ip, subset.ports[0].port
            except (ApiException, IndexError, TypeError):
                self._service_env = {}
            else:
                self._service_env = {
                    "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
                    "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "KUBERNETES_PORT": f"tcp://{host}:{port}",
                    f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
                    f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp", f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
                    f"KUBERNETES_PORT_{port}_TCP_ADDR": host}
        return self._service_env

    def _pod_tokens(self, pod: dict) -> dict[tuple[str, str], str]:
        """The ServiceAccount tokens of the pod's projected volumes, requested
        with TokenRequest (bound to the pod) and renewed at 80% of their
        lifetime, as the kubelet does. An API refusal leaves the token out:
        ``pod_plan`` then waits for it."""
        meta = pod["metadata"]
        have = self._tokens.setdefault(meta["uid"], {})
        for volume, path, audience, seconds in token_requests(pod):
            token, renew = have.get((volume, path), ("", 0.0))
            if token and time.time() < renew:
                continue
            spec = {"expirationSeconds": seconds,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
            if audience:
                spec["audiences"] = [audience]
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
            try:
                answer = self.core.create_namespaced_service_account_token(
                    pod["spec"].get("serviceAccountName") or "default", meta["namespace"], body)
            except ApiException as exc:
                self.progress(f"kubelet: no ServiceAccount token for pod {meta['namespace']}/{meta['name']}: "
                              f"{exc.status} {exc.reason}")
                continue
            have[(volume, path)] = (answer.status.token, time.time() + 0.8 * seconds)
        return {key: token for key, (token, _) in have.items()}

    def _admit(self, pod: dict) -> None:
        meta = pod["metadata"]
        index, ip = self._free_address()
        try:
            plan = self._plan(pod, ip)
        except LookupError as exc:  # a ConfigMap or Secret not there yet: wait, and say so
            self._status(meta, {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": str(exc)}]})
            return
        node = pod["spec"]["nodeName"]
        local = LocalPod(meta["uid"], meta["namespace"], meta["name"], node, index, ip)
        refused = None
        with self.lock:
            if plan.gpus:
                taken = [i for p in self.pods.values() if p.node == node for i in p.gpus]
                try:
                    local.gpus = list(gpus.allocate(self.nodes[node].gpus, taken, plan.gpus))
                except gpus.Unavailable as exc:  # the scheduler counted them: bound past it
                    refused = str(exc)
            if refused is None:
                self.pods[local.uid] = local
        if refused is not None:
            self._status(meta, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": refused})
            self._event(meta, "Warning", "UnexpectedAdmissionError", refused)
            return
        self._save()  # before anything exists: a restarted kubelet finds and removes it
        self._start(local, plan)

    def _start(self, local: LocalPod, plan: PodPlan) -> None:
        key = self._netns_key(local)
        pod_dir = self.pod_dir(local)
        names = [c.name for c in plan.containers]
        try:
            images = self._pull(local, plan)
        except PullError as exc:
            backoff = local.waiting in ("ErrImagePull", "ImagePullBackOff")
            reason = "ImagePullBackOff" if backoff and exc.reason == "ErrImagePull" else exc.reason
            self.progress(f"kubelet: pod {local.namespace}/{local.name}: {exc.message}")
            self._waiting(local, names, reason, exc.message, "BackOff" if reason == "ImagePullBackOff" else "Failed")
            return
        self.net.detach(key, local.index)  # what a killed kubelet may have left
        self.net.attach(key, local.index, local.ip)
        runcruntime.prepare(plan, images, pod_dir, self.hosts_path, self.dir / "storage",
                            netns=self.net.netns(key), gpus=local.gpus)
        local.image_ids = [i.image_id for i in images]
        local.volumes = self._volume_hash(plan)
        local.holder = runcruntime.start(self.net.netns(key), pod_dir)
        local.started = now()
        local.ready = False
        local.waiting, local.attempts = "", 0
        self._save()
        self.progress(f"kubelet: started pod {local.namespace}/{local.name} on {local.node} ({local.ip})")
        self._report(local, plan)

    def _pull(self, local: LocalPod, plan: PodPlan) -> list[Pulled]:
        """Each container's image under its pull policy (:mod:`.pulls`), with the pod's pull secrets;
        an Event for each image the registry was asked for, as a kubelet posts."""
        meta = {"name": local.name, "namespace": local.namespace, "uid": local.uid}
        auths = pull_secret_auths(plan.pull_secrets)
        out = []
        for c in plan.containers:
            try:
                image, asked = self.images.image(c.image, c.pull_policy, auths)
            except PullError as exc:
                raise PullError(exc.reason, f'Failed to pull image "{c.image}" (container {c.name}): {exc.message}',
                                exc.status) from None
            if asked:
                self._event(meta, "Normal", "Pulled",
                            f'Successfully pulled image "{c.image}" ({image.digest})')
            out.append(image)
        return out

    @staticmethod
    def _volume_hash(plan: PodPlan) -> str:
        h = hashlib.sha256()
        for f in sorted(plan.files, key=lambda f: f.path):
            h.update(f.path.encode() + b"\0" + f.content + b"\0")
        return h.hexdigest()[:16]

    def _tend(self, pod: dict, local: LocalPod) -> None:
        plan = None
        if not runtime.alive(local.holder) and local.waiting:
            if time.time() < local.retry_at:
                return
            try:
                plan = self._plan(pod, local.ip)
            except LookupError:  # what it mounts is gone for now: try again next round
                return
            self._start(local, plan)
            return
        if not runtime.alive(local.holder):
            if pod["spec"].get("restartPolicy", "Always") == "Never":
                self._status(pod["metadata"], {"phase": "Failed", "conditions": [
                    {"type": "Ready", "status": "False", "reason": "PodFailed"}]})
                return
            try:
                plan = self._plan(pod, local.ip)
            except LookupError:  # what it mounts is gone for now: try again next round
                return
            local.restarts += 1
            self.progress(f"kubelet: pod {local.namespace}/{local.name} ended; restarting it ({local.restarts})")
            self._start(local, plan)
            return
        if time.monotonic() - self._probed.get(local.uid, 0) < 2:
            return
        self._probed[local.uid] = time.monotonic()
        try:
            plan = self._plan(pod, local.ip)
        except LookupError:
            return
        digest = self._volume_hash(plan)
        if digest != local.volumes:
            runtime.refresh_volumes(plan, self.pod_dir(local))
            local.volumes = digest
            self._save()
        ready = runcruntime.ready(local.holder, self.pod_dir(local), plan)
        if ready != local.ready or pod.get("status", {}).get("phase") != "Running":
            local.ready = ready
            self._save()
            self._report(local, plan)

    def _report(self, local: LocalPod, plan: PodPlan) -> None:
        ready = "True" if local.ready else "False"
        stamp = now()
        ids = local.image_ids
        self._status({"name": local.name, "namespace": local.namespace}, {
            "phase": "Running", "podIP": local.ip, "podIPs": [{"ip": local.ip}], "hostIP": self.net.gateway,
            "startTime": local.started,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": stamp},
                {"type": "Ready", "status": ready, "lastTransitionTime": stamp},
            ],
            "containerStatuses": [{
                "name": c.name, "ready": local.ready, "restartCount": local.restarts, "started": True,
                "image": c.image, "imageID": ids[i] if i < len(ids) else "",
                "containerID": f"sandbox://{local.holder}",
                "state": {"running": {"startedAt": local.started}},
            } for i, c in enumerate(plan.containers)],
        })

    def _status(self, meta: dict, status: dict) -> None:
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _stop(self, local: LocalPod, grace: int, delete: bool) -> None:
        self.stopping.add(local.uid)

        def work():
            try:
                runcruntime.stop(local.holder, grace=grace)
                runcruntime.remove(self.pod_dir(local))  # also when its shim was gone already
                self.net.detach(self._netns_key(local), local.index)
                with self.lock:
                    self.pods.pop(local.uid, None)
                self._save()
                self.progress(f"kubelet: stopped pod {local.namespace}/{local.name}")
                if delete:
                    self._delete({"name": local.name, "namespace": local.namespace, "uid": local.uid})
            finally:
                self.stopping.discard(local.uid)

        self.pool.submit(work)

    def _delete(self, meta: dict) -> None:
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                            body=client.V1DeleteOptions(
                                                grace_period_seconds=0,
                                                preconditions=client.V1Preconditions(uid=meta["uid"])))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # Names

    def _write_hosts(self, bound: dict[str, dict]) -> None:
        plans = []
        for uid, pod in bound.items():
            local = self.pods.get(uid)
            if local is None:
                continue
            meta, spec = pod["metadata"], pod["spec"]
            plans.append(PodPlan(name=meta["name"], namespace=meta["namespace"], owner_kind="", owner="",
                                 labels=meta.get("labels", {}), hostname=spec.get("hostname") or meta["name"],
                                 subdomain=spec.get("subdomain"), ip=local.ip))
        ser = self.core.api_client.sanitize_for_serialization
        services = {f"{s.metadata.namespace}/{s.metadata.name}": ser(s)
                    for s in self.core.list_service_for_all_namespaces().items}
        text = hosts_file(plans, services)
        if text != self._hosts:
            # In place: every pod bind-mounts this very file.
            with open(self.hosts_path, "r+") as f:
                f.seek(0)
                f.write(text)
                f.truncate()
            self._hosts = text

    def stop_all(self) -> None:
        """Stop every pod this kubelet runs (the sandbox is going down)."""
        for local in list(self.pods.values()):
            if local.uid not in self.stopping:
                self._stop(local, grace=30, delete=False)
        self.pool.shutdown(wait=True)


def run_for_sandbox(state_dir: Path, stop: threading.Event, progress: Progress = lambda _: None) -> None:
    """The kubelet of the sandbox in ``state_dir`` (its state.json names the Nodes and the network).

    Stopping it leaves its pods running, as stopping a kubelet does; the
    next one adopts them. ``sandbox down`` stops the pods.
    """
    from kubernetes import config

    state = json.loads((state_dir / "state.json").read_text())
    net = runtime.Network(state["sid"], state["subnet"], state["gateway"])
    # The kubelet's own identity (system:node:...), not the administrator's.
    api = config.new_client_from_config(str(state_dir / "kubelet.kubeconfig"))
    kubelet = Kubelet(api, [SandboxNode(**n) for n in state["nodes"]], state_dir, net, progress)
    # The network's NetworkPolicy agent, with the administrator's credentials (as a CNI's own).
    agent = PolicyAgent(config.new_client_from_config(str(state_dir / "kubeconfig")), net, progress)
    threading.Thread(target=agent.run, args=(stop,), name="netpol", daemon=True).start()
    try:
        kubelet.run(stop)
    finally:
        kubelet.pool.shutdown(wait=True)
