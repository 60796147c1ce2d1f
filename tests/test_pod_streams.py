"""`kubectl logs` and `kubectl exec` against the Kubernetes stand-in and the
sandbox's kubelet, as on a real cluster: the API server proxies pods/log and
pods/exec to the kubelet of the pod's node, which serves them from the pod
runtime. Pods run `sh` in the controller image; the clients are real
kubectl and the official Python client."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest
import websocket
import yaml
from kubernetes.stream import stream

from sandbox import oci
from sandbox.images import tags
from sandbox.imagestore import ImageStore
from sandbox.kubelet import SandboxNode

from .kubeletworld import KubeletWorld
from .test_kubelet import wait_for
from .tiers import needs

#: Any image with a shell: the controller's (the sandbox needs it built anyway).
IMAGE = tags("controller")[0]
NODES = [SandboxNode("streams-0")]
SIDE = "echo side-hello; echo side-to-stderr >&2; exec sleep 100000"
MAIN = "echo line1; echo line2 >&2; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done"
COUNTER = "for i in 1 2 3 4 5; do echo count $i; sleep 0.3; done; exit 3"


def pod(name: str, containers: dict[str, str], annotations: dict | None = None, volumes: list | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"terminationGracePeriodSeconds": 1, "volumes": volumes or [],
                     "containers": [{"name": c, "image": IMAGE, "command": ["sh", "-c", script],
                                     "volumeMounts": [{"name": v["name"], "mountPath": "/v"} for v in volumes or []]}
                                    for c, script in containers.items()]}}


class World(KubeletWorld):
    def __init__(self, tmp: Path):
        super().__init__(tmp, "kstrm", "10.253.83.0/24", NODES, images=[IMAGE])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return self.run_kubectl(*args, input=input, check=check)

    def running(self, name: str) -> bool:
        p = self.core.read_namespaced_pod(name, "default")
        return p.status.phase == "Running"



@pytest.fixture(scope="module")
@needs("root")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("streams"))
    try:
        docs = [pod("two", {"main": MAIN, "side": SIDE}),
                pod("picky", {"main": MAIN, "side": SIDE},
                    annotations={"kubectl.kubernetes.io/default-container": "side"}),
                pod("counter", {"count": COUNTER}),
                # Waits for a ConfigMap nobody makes: admitted, never started.
                pod("stuck", {"main": MAIN}, volumes=[{"name": "cfg", "configMap": {"name": "missing"}}])]
        w.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        for name in ("two", "picky", "counter"):
            wait_for(f"pod {name} running", lambda n=name: w.running(n), timeout=60)
        wait_for("two's containers writing", lambda: "side-hello" in w.kubectl("logs", "two", "-c", "side").stdout)
        yield w
    finally:
        w.close()


# The kubelet's API: where it is, and who may call it


def test_nodes_publish_their_kubelet_endpoint(world):
    node = world.core.read_node("streams-0")
    assert node.status.daemon_endpoints.kubelet_endpoint.port == world.kubelet.server.port > 0
    assert {"InternalDNS": "localhost", "InternalIP": "10.253.83.1"}.items() <= \
        {a.type: a.address for a in node.status.addresses}.items()


def _kubelet_get(world, url: str, cert: tuple[Path, Path] | None) -> int | str:
    """The HTTP status the kubelet answers with, or "refused" when TLS refuses the client."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(*cert)
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ssl.SSLError, ConnectionError):
        return "refused"


def test_the_kubelet_answers_only_the_api_server(world):
    url = f"https://127.0.0.1:{world.kubelet.server.port}/containerLogs/default/two/side"
    pki = world.dir / "api" / "pki"
    assert _kubelet_get(world, url, None) == "refused"
    # Signed by the same CA, but not the API server's kubelet client certificate.
    assert _kubelet_get(world, url, (pki / "server.crt", pki / "server.key")) in ("refused", 403)
    assert _kubelet_get(world, url, (pki / "kubelet-client.crt", pki / "kubelet-client.key")) == 200


# Logs


def test_logs_of_each_container_with_tail(world):
    side = world.kubectl("logs", "two", "-c", "side").stdout
    assert side == "side-hello\nside-to-stderr\n"
    main = world.kubectl("logs", "two", "-c", "main").stdout.splitlines()
    assert main[:3] == ["line1", "line2", "tick 1"]
    tail = world.kubectl("logs", "two", "-c", "main", "--tail=2").stdout.splitlines()
    assert len(tail) == 2 and all(line.startswith("tick ") for line in tail)
    assert world.kubectl("logs", "two", "-c", "side", "--limit-bytes=4").stdout == "side"


def test_kubectl_picks_the_default_container(world):
    # kubectl chooses: the first container, or the one the annotation names, and says so.
    first = world.kubectl("logs", "two", "--tail=1")
    assert first.stdout.startswith("tick ") and 'Defaulted container "main"' in first.stderr
    assert world.kubectl("logs", "picky").stdout == "side-hello\nside-to-stderr\n"


def test_follow_streams_until_the_container_ends_and_previous_after_a_restart(world):
    wait_for("counter restarted once", lambda: any(
        p.name == "counter" and p.restarts >= 1 for p in list(world.kubelet.pods.values())), timeout=60)

    def ok(*args):  # the pod may be in the moment of its restart: "waiting to start", then again
        proc = world.kubectl(*args, check=False)
        return proc.returncode == 0 and proc

    start = time.monotonic()
    follow = wait_for("kubectl logs -f counter", lambda: ok("logs", "-f", "counter"), timeout=20)
    assert follow.stdout.splitlines()[-1] == "count 5", follow.stdout
    assert time.monotonic() - start < 15  # it ended with the container, not at a timeout
    previous = wait_for("kubectl logs --previous counter", lambda: ok("logs", "counter", "--previous"), timeout=20)
    assert previous.stdout.splitlines() == [f"count {i}" for i in range(1, 6)]


def test_follow_streams_new_lines_until_the_client_goes(world):
    now = int(world.kubectl("logs", "two", "-c", "main", "--tail=1").stdout.split()[1])
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(world.kubeconfig), "logs", "-f", "two", "-c", "main"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "line1\n"
        # Written about a second after kubectl started following: it comes as the container writes it.
        later = f"tick {now + 3}\n"
        assert any(proc.stdout.readline() == later for _ in range(now + 4)), later
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_log_errors_say_what_is_wrong(world):
    missing = world.kubectl("logs", "two", "-c", "nope", check=False)
    assert missing.returncode == 1 and "container nope is not valid for pod two" in missing.stderr
    never = world.kubectl("logs", "two", "-c", "side", "--previous", check=False)
    assert never.returncode == 1 and 'previous terminated container "side" in pod "two" not found' in never.stderr
    stuck = world.kubectl("logs", "stuck", check=False)
    assert stuck.returncode == 1 and 'container "main" in pod "stuck" is waiting to start' in stuck.stderr
    stamps = world.kubectl("logs", "two", "-c", "side", "--timestamps", check=False)
    assert stamps.returncode == 1 and "--tail" in stamps.stderr
    gone = world.kubectl("logs", "nosuchpod", check=False)
    assert gone.returncode == 1 and 'pods "nosuchpod" not found' in gone.stderr


# Exec


def test_exec_runs_in_the_containers_namespaces_and_propagates_the_exit_code(world):
    ip = world.core.read_namespaced_pod("two", "default").status.pod_ip
    out = world.kubectl("exec", "two", "-c", "side", "--", "sh", "-c",
                        "hostname; echo $PATH; tr '\\0' ' ' </proc/1/cmdline; echo; "
                        f"grep -c ' {ip}$' /proc/net/fib_trie; test -d /opt/slurmk8s/bin && echo own-root").stdout
    lines = out.splitlines()
    image_path = next(e.split("=", 1)[1] for e in ImageStore().lookup(IMAGE).config.env if e.startswith("PATH="))
    assert lines[0] == "two" and lines[1] == image_path  # the image's ENV
    pause = oci.pause_spec(root="/", hostname="", net="", cgroups_path="")["process"]["args"]
    assert lines[2] == " ".join(pause) + " "  # PID 1 of the pod's PID namespace: its pause container
    assert int(lines[3]) >= 1 and lines[4] == "own-root"  # the pod's own address; the image's root
    failed = world.kubectl("exec", "two", "-c", "side", "--", "sh", "-c", "echo out; echo err >&2; exit 7",
                           check=False)
    # kubectl reads the code from the Status on channel 3, says so, and exits with it.
    assert (failed.returncode, failed.stdout) == (7, "out\n")
    assert failed.stderr == "err\ncommand terminated with exit code 7\n"


def test_exec_with_stdin(world):
    upper = world.kubectl("exec", "-i", "two", "-c", "main", "--", "tr", "a-z", "A-Z", input="hello\nworld\n")
    assert upper.stdout == "HELLO\nWORLD\n"
    counted = world.kubectl("exec", "-i", "two", "-c", "main", "--", "sh", "-c", "wc -l; exit 4",
                            input="a\nb\nc\n", check=False)
    assert (counted.returncode, counted.stdout.strip()) == (4, "3")
    # Megabytes each way arrive whole, in order.
    big = "".join(f"{i:07d}\n" for i in range(400_000))
    assert world.kubectl("exec", "-i", "two", "-c", "main", "--", "md5sum", input=big).stdout.split()[0] == \
        hashlib.md5(big.encode()).hexdigest()
    assert world.kubectl("exec", "two", "-c", "main", "--", "seq", "-w", "0", "399999").stdout == \
        "".join(f"{i:06d}\n" for i in range(400_000))


def test_kubectl_cp_goes_through_exec(world, tmp_path):
    (tmp_path / "notes.txt").write_text("hello pod\n")
    world.kubectl("cp", str(tmp_path / "notes.txt"), "two:/tmp/notes.txt", "-c", "main")
    assert world.kubectl("exec", "two", "-c", "main", "--", "cat", "/tmp/notes.txt").stdout == "hello pod\n"
    world.kubectl("cp", "two:/tmp/notes.txt", str(tmp_path / "back.txt"), "-c", "main")
    assert (tmp_path / "back.txt").read_text() == "hello pod\n"


def test_exec_with_a_terminal(world):
    text, code = world.exec_in_terminal(["two", "-c", "side"], b"stty size; tty -s && echo has-a-tty; echo $((6*7)); exit 5\n")
    assert "33 97" in text and "has-a-tty" in text and "42" in text, text
    assert code == 5, text


def test_exec_with_the_python_client(world):
    out = stream(world.core.connect_get_namespaced_pod_exec, "two", "default", container="main",
                 command=["sh", "-c", "echo $HOSTNAME"], stdout=True, stderr=True, stdin=False, tty=False)
    assert out.strip() == "two"
    resp = stream(world.core.connect_get_namespaced_pod_exec, "two", "default", container="main",
                  command=["sh", "-c", "read line; echo got $line; exit 9"], stdout=True, stderr=True, stdin=True,
                  tty=False, _preload_content=False)
    resp.write_stdin("ping\n")
    resp.run_forever(timeout=20)
    assert resp.read_stdout().strip() == "got ping"
    assert resp.returncode == 9
    resp.close()


def test_exec_over_the_older_v4_protocol(world):
    query = urlencode([("command", "sh"), ("command", "-c"), ("command", "echo hi; echo oops >&2; exit 3"),
                       ("container", "main"), ("stdout", "true"), ("stderr", "true")])
    ws = websocket.create_connection(
        world.server.url.replace("https://", "wss://") + f"/api/v1/namespaces/default/pods/two/exec?{query}",
        header=[f"Authorization: Bearer {world.server.token}"], subprotocols=["v4.channel.k8s.io"],
        sslopt={"ca_certs": str(world.server.ca_path)}, timeout=20)
    assert ws.subprotocol == "v4.channel.k8s.io"
    got: dict[int, bytes] = {}
    while True:
        opcode, data = ws.recv_data()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        got[data[0]] = got.get(data[0], b"") + data[1:]
    assert got[1] == b"hi\n" and got[2] == b"oops\n"
    status = json.loads(got[3])
    assert status["reason"] == "NonZeroExitCode" and status["details"]["causes"][0]["message"] == "3"


def test_exec_errors_say_what_is_wrong(world):
    stuck = world.kubectl("exec", "stuck", "--", "true", check=False)
    assert stuck.returncode == 1 and 'container "main" in pod "stuck"' in stuck.stderr, stuck.stderr
    nope = world.kubectl("exec", "two", "-c", "nope", "--", "true", check=False)
    assert nope.returncode == 1 and "container nope is not valid for pod two" in nope.stderr
    missing = world.kubectl("exec", "two", "-c", "main", "--", "/no/such/command", check=False)
    assert missing.returncode != 0 and "/no/such/command" in missing.stderr
    # kubectl speaks SPDY only when told to (or when the WebSocket upgrade fails): it learns what to do.
    spdy = subprocess.run(["kubectl", "--kubeconfig", str(world.kubeconfig), "exec", "two", "--", "true"],
                          env={**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"},
                          capture_output=True, text=True, timeout=60)
    assert spdy.returncode == 1 and "exec is served over WebSocket" in spdy.stderr, spdy.stderr
    attach = world.kubectl("attach", "two", "-c", "main", check=False)
    assert attach.returncode == 1 and "pods/attach is not served" in attach.stderr and "kubectl logs -f" in attach.stderr
    forward = world.kubectl("port-forward", "two", "8080", check=False)
    assert forward.returncode == 1 and "pods/portforward is not served" in forward.stderr
