"""A real Slurm cluster from a SlurmCluster manifest, on this machine, without Docker.

``Sandbox`` renders the manifest, plans its pods and runs them with
:mod:`.runtime`. Everything it starts is written to ``state.json`` first, so
``down`` (or the next ``up``, after a crash) finds and removes it all:
processes, network namespaces, veths, the bridge. Data that Kubernetes would
keep in PersistentVolumes (slurmctld state, shared storage) and the cluster's
keys stay under the state directory until ``down --purge``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..api.cluster import SlurmCluster
from ..render import ClusterKeys, render
from ..render import names
from ..render.keys import ssh_keypair
from ..slurm import SlurmClient, SlurmError
from . import runtime
from .plan import ContainerPlan, PodPlan, plan

DEFAULT_STATE_DIR = Path(os.environ.get("SLURMK8S_SANDBOX_DIR", "/var/lib/slurmk8s/sandbox"))
DEFAULT_SUBNET = "10.253.0.0/24"

Progress = Callable[[str], None]


class SandboxFailed(RuntimeError):
    """The sandbox could not be brought up; the message says which pod and why."""


@dataclass
class PodState:
    name: str
    index: int
    ip: str
    holder: int | None
    grace: int
    containers: list[dict]  # ContainerPlan fields, for exec and readiness
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def component(self) -> str:
        return self.containers[0]["component"]

    @property
    def env(self) -> dict[str, str]:
        return self.containers[0]["env"]

    def as_plan(self) -> PodPlan:
        return PodPlan(name=self.name, namespace="", owner_kind="", owner="", labels=self.labels,
                       hostname=self.name, subdomain=None, ip=self.ip,
                       containers=[ContainerPlan(**{**c, "mounts": []}) for c in self.containers])

    @classmethod
    def of(cls, pod: PodPlan, index: int) -> "PodState":
        containers = [{k: v for k, v in asdict(c).items() if k != "mounts"} for c in pod.containers]
        return cls(pod.name, index, pod.ip, None, pod.termination_grace, containers, pod.labels)


@dataclass
class State:
    cluster: str
    namespace: str
    sid: str
    subnet: str
    gateway: str
    pods: list[PodState]
    login: dict | None
    shared_storage: dict | None
    started: float

    @classmethod
    def load(cls, path: Path) -> "State | None":
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["pods"] = [PodState(**p) for p in data["pods"]]
        return cls(**data)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)  # atomic: a crash never leaves half a state file

    def pod(self, name: str) -> PodState:
        for p in self.pods:
            if p.name == name:
                return p
        raise KeyError(f"no pod {name!r}; pods: {', '.join(p.name for p in self.pods)}")


class Sandbox:
    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, progress: Progress = lambda _: None):
        self.dir = state_dir
        self.progress = progress

    # Paths

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def storage(self) -> Path:
        return self.dir / "storage"

    def pod_dir(self, name: str) -> Path:
        return self.dir / "pods" / name

    def state(self) -> State | None:
        return State.load(self.state_file)

    def network(self, state: State) -> runtime.Network:
        return runtime.Network(state.sid, state.subnet, state.gateway)

    # Bring up

    def up(self, cluster: SlurmCluster, *, subnet: str = DEFAULT_SUBNET, timeout: float = 300) -> State:
        t0 = time.monotonic()
        try:
            old = self.state()
        except (TypeError, KeyError, ValueError):
            self.progress("found a sandbox written by another slurmk8s version; cleaning it up first")
            self.down()
            old = None
        if old is not None:
            if old.cluster == cluster.name and self._healthy(old):
                self.progress(f"sandbox {old.cluster} is already running; checking its nodes")
                self._wait_nodes(old, cluster, t0, timeout)
                return old
            self.progress(f"found a sandbox that is not healthy ({old.cluster}); cleaning it up first")
            self.down()
        self.dir.mkdir(parents=True, exist_ok=True)
        keys, _ = ClusterKeys.from_dir(self.dir / "keys")
        user_keys, login = self._login_identity(cluster)
        p = plan(render(cluster, keys), subnet=subnet, user_keys=user_keys)
        sid = runtime.short_id(str(self.dir.resolve()))
        state = State(
            cluster=cluster.name, namespace=cluster.namespace, sid=sid, subnet=p.subnet, gateway=p.gateway,
            pods=[PodState.of(pod, i) for i, pod in enumerate(p.pods)],
            login=None, shared_storage=self._shared_storage(cluster), started=time.time(),
        )
        if login is not None:
            login_pod = next((x for x in p.pods if x.component == "login"), None)
            state.login = {**login, "host": login_pod.ip if login_pod else None}
            (self.dir / "ssh").mkdir(exist_ok=True)
            (self.dir / "ssh/known_hosts").write_text(
                "".join(f"{x.ip} {keys.ssh_host_public_key()}\n" for x in p.pods if x.component == "login"))
        state.save(self.state_file)  # before anything starts: down can always find it

        net = self.network(state)
        self.progress(f"network: bridge {net.bridge}, {p.subnet}, gateway {p.gateway}")
        net.create()
        hosts = self.dir / "hosts"
        hosts.write_text(p.hosts)
        for claim in p.claims.values():
            (self.storage / claim).mkdir(parents=True, exist_ok=True)
        by_name = {pod.name: pod for pod in p.pods}
        controller = [pod for pod in p.pods if pod.component == "slurmctld"]
        rest = [pod for pod in p.pods if pod.component != "slurmctld"]
        for group in (controller, rest):
            for pod in group:
                self._start(state, pod, hosts)
            for pod in group:
                self._wait_ready(state, by_name[pod.name], t0, timeout)
        self._wait_nodes(state, cluster, t0, timeout)
        self.progress(f"sandbox {cluster.name} is up after {time.monotonic() - t0:.1f}s")
        return state

    def _start(self, state: State, pod: PodPlan, hosts: Path) -> None:
        ps = state.pod(pod.name)
        net = self.network(state)
        self.progress(f"starting pod {pod.name} ({pod.component}, {pod.ip})")
        net.attach(pod.name, ps.index, pod.ip)
        runtime.prepare(pod, self.pod_dir(pod.name), hosts, self.storage)
        ps.holder = runtime.start(net.netns(pod.name), self.pod_dir(pod.name))
        state.save(self.state_file)

    def _fail(self, pod: str, why: str) -> SandboxFailed:
        log = self.logs(pod, tail=25)
        return SandboxFailed(
            f"pod {pod} {why}.\nLast lines of its log (slurmk8s sandbox logs {pod}):\n{log}\n"
            "Fix the cause and run `slurmk8s sandbox up` again (it cleans up first), "
            "or `slurmk8s sandbox down`."
        )

    def _wait_ready(self, state: State, pod: PodPlan, t0: float, timeout: float) -> None:
        ps = state.pod(pod.name)
        next_note = time.monotonic() + 5
        while not runtime.ready(ps.holder, self.pod_dir(pod.name), pod):
            if not runtime.alive(ps.holder):
                raise self._fail(pod.name, "exited before it became ready")
            if time.monotonic() - t0 > timeout:
                raise self._fail(pod.name, f"was not ready within {timeout:.0f}s")
            if time.monotonic() > next_note:
                self.progress(f"waiting for pod {pod.name} to be ready ({time.monotonic() - t0:.0f}s)")
                next_note = time.monotonic() + 5
            time.sleep(0.3)
        self.progress(f"pod {pod.name} ready after {time.monotonic() - t0:.1f}s")

    def _wait_nodes(self, state: State, cluster: SlurmCluster, t0: float, timeout: float) -> None:
        expected = {f"{cluster.name}-{ns.name}-{i}" for ns in cluster.spec.node_sets for i in range(ns.replicas)}
        slurm = self.slurm(state)
        last = ""
        while True:
            try:
                nodes = {n.name: n for n in slurm.nodes()}
            except SlurmError as exc:
                nodes, last = {}, f"slurmctld not answering: {exc.stderr}"
            idle = sorted(n for n in expected if n in nodes and nodes[n].state == "idle" and not nodes[n].flags
                          - {"DYNAMIC_NORM"})
            if len(idle) == len(expected):
                self.progress(f"all {len(expected)} Slurm nodes idle after {time.monotonic() - t0:.1f}s")
                return
            note = ", ".join(f"{n} {self._node_state(nodes.get(n))}" for n in sorted(expected))
            if note != last:
                self.progress(f"Slurm nodes {len(idle)}/{len(expected)} idle: {note}")
                last = note
            for n in sorted(expected - set(idle)):
                if not runtime.alive(state.pod(n).holder):
                    raise self._fail(n, "exited before its Slurm node became idle")
            if time.monotonic() - t0 > timeout:
                stuck = sorted(expected - set(idle))[0]
                raise self._fail(stuck, f"did not become an idle Slurm node within {timeout:.0f}s")
            time.sleep(0.5)

    @staticmethod
    def _node_state(node) -> str:
        if node is None:
            return "not registered"
        return "+".join([node.state, *sorted(node.flags - {"DYNAMIC_NORM"})]).lower()

    def _healthy(self, state: State) -> bool:
        return all(runtime.alive(p.holder) for p in state.pods)

    def _login_identity(self, cluster: SlurmCluster) -> tuple[dict[str, str], dict | None]:
        """A key pair the sandbox logs in with, offered for every login user.

        In a real cluster the users' keys come from the manifest and its
        Secrets; the sandbox plays the Secrets' part for sshPublicKeysFrom.
        """
        users = cluster.spec.login.users
        if not users:
            return {}, None
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
        login = {"port": names.SSH_PORT, "user": user.name,
                 "identityFile": str(ident.resolve()),
                 "knownHostsFile": str((ssh / "known_hosts").resolve())}
        return {u.name: public for u in users}, login

    def _shared_storage(self, cluster: SlurmCluster) -> dict | None:
        storage = cluster.spec.shared_storage
        if storage is None:
            return None
        vols = [{"name": v.name, "mountPath": v.mount_path,
                 "hostPath": str((self.storage / "claims" / (v.existing_claim or f"{cluster.name}-{v.name}")).resolve())}
                for v in storage.volumes]
        first = vols[0]
        return {"hostPath": first["hostPath"], "mountPath": first["mountPath"],
                "checkpointDir": storage.checkpoint_dir, "volumes": vols}

    # Use

    def slurm(self, state: State | None = None) -> SlurmClient:
        """The Slurm facade, running commands in the controller pod."""
        state = state or self._require()
        ctld = next(p for p in state.pods if p.component == "slurmctld")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **ctld.env}

        def run(argv, stdin):
            try:
                return subprocess.run(runtime.exec_argv(ctld.holder, self.pod_dir(ctld.name), argv, env), input=stdin,
                                      capture_output=True, text=True, timeout=60)
            except runtime.SandboxError as exc:
                return subprocess.CompletedProcess(argv, 1, "", f"Unable to contact slurm controller: {exc}")

        return SlurmClient(run)

    def exec(self, pod: str, argv: list[str]) -> list[str]:
        state = self._require()
        ps = state.pod(pod)
        return runtime.exec_argv(ps.holder, self.pod_dir(pod), argv,
                                 {"PATH": "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **ps.env})

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
        state = self.state()
        known = ", ".join(p.name for p in state.pods) if state else "(no sandbox)"
        pod_dir = self.pod_dir(pod)
        ctrs = sorted(pod_dir.glob("containers/*"), key=lambda d: int(d.name))
        if not ctrs:
            raise KeyError(f"no log for pod {pod!r}; pods: {known}")
        names = [(d / "name").read_text() for d in ctrs]
        if container is not None and container not in names:
            raise KeyError(f"pod {pod} has no container {container!r}; containers: {', '.join(names)}")
        ctr = ctrs[names.index(container) if container else 0]
        lines = (ctr / "log").read_text(errors="replace").splitlines()
        if (pod_dir / "log").exists():
            lines += (pod_dir / "log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def status(self) -> dict:
        state = self._require()
        try:
            nodes = {n.name: n for n in self.slurm(state).nodes()}
        except SlurmError:
            nodes = {}
        pods = []
        for p in state.pods:
            running = runtime.alive(p.holder)
            node = nodes.get(p.name)
            pods.append({
                "name": p.name, "component": p.component, "ip": p.ip,
                "phase": "Running" if running else "Failed",
                "ready": running and runtime.ready(p.holder, self.pod_dir(p.name), p.as_plan()),
                "containers": [c["name"] for c in p.containers],
                "slurmState": self._node_state(node) if node else None,
            })
        return {
            "cluster": state.cluster, "namespace": state.namespace, "stateDir": str(self.dir.resolve()),
            "network": {"bridge": self.network(state).bridge, "subnet": state.subnet, "gateway": state.gateway},
            "pods": pods,
            "slurmNodes": {n.name: self._node_state(n) for n in nodes.values()},
            "login": {k: v for k, v in (state.login or {}).items() if k != "knownHostsFile"} or None,
            "sharedStorage": state.shared_storage,
        }

    def _require(self) -> State:
        state = self.state()
        if state is None:
            raise SandboxFailed(f"no sandbox in {self.dir}; start one with `slurmk8s sandbox up -f <manifest>`")
        return state

    # Tear down

    def down(self, purge: bool = False) -> list[str]:
        """Stop everything the sandbox started. Idempotent. Returns what it removed."""
        removed = []
        # Only the fields every version of state.json has: down must work on a
        # sandbox that an older or newer slurmk8s started.
        state = json.loads(self.state_file.read_text()) if self.state_file.exists() else None
        if state is not None:
            for p in reversed(state["pods"]):
                if runtime.alive(p["holder"]):
                    self.progress(f"stopping pod {p['name']}")
                    runtime.stop(p["holder"], grace=min(p["grace"], 30))
                    removed.append(f"pod {p['name']}")
            net = runtime.Network(state["sid"], state["subnet"], state["gateway"])
            for p in state["pods"]:
                net.detach(p["name"], p["index"])
            net.delete()
            spaces, links = net.leftovers()
            for ns in spaces:
                runtime.sh("ip", "netns", "del", ns, check=False)
            for link in links:
                runtime.sh("ip", "link", "del", link, check=False)
            removed.append(f"network {net.bridge}")
        shutil.rmtree(self.dir / "pods", ignore_errors=True)
        for name in ("state.json", "hosts"):
            (self.dir / name).unlink(missing_ok=True)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            removed.append(f"state directory {self.dir}")
        return removed
