"""The pure parts of kubectl logs and exec: the remote command protocol, log
queries and layout, and how the API server picks a pod's container and its
node's kubelet."""

from __future__ import annotations

import json

import pytest
from multidict import MultiDict

from sandbox import podlogs, remotecommand
from sandbox.apiserver import podproxy
from sandbox.apiserver.errors import APIError
from sandbox.kubeletserver import node_status
from sandbox.remotecommand import ProtocolError

# The remote command protocol


def test_exec_options_from_a_query():
    q = MultiDict([("command", "sh"), ("command", "-c"), ("command", "echo hi"), ("stdin", "true"),
                   ("stdout", "1"), ("tty", "false")])
    opts = remotecommand.exec_options(q)
    assert opts == remotecommand.ExecOptions(("sh", "-c", "echo hi"), stdin=True, stdout=True)
    assert remotecommand.exec_options({"command": ["ls"], "stderr": ["true"]}).stderr


@pytest.mark.parametrize("query, says", [
    ({"stdout": ["true"]}, "command is required"),
    ({"command": ["ls"]}, "at least one of stdin, stdout, stderr"),
    ({"command": ["ls"], "stdout": ["yes"]}, "stdout must be true or false"),
    ({"command": ["sh"], "tty": ["true"], "stdout": ["true"], "stderr": ["true"]}, "stderr=false with tty=true"),
])
def test_exec_options_refused_say_why(query, says):
    with pytest.raises(ProtocolError, match=says):
        remotecommand.exec_options(query)


def test_the_newest_offered_protocol_is_chosen():
    assert remotecommand.chosen_protocol("v4.channel.k8s.io, v5.channel.k8s.io") == "v5.channel.k8s.io"
    assert remotecommand.chosen_protocol("v4.channel.k8s.io,channel.k8s.io") == "v4.channel.k8s.io"
    assert remotecommand.chosen_protocol("channel.k8s.io, base64.channel.k8s.io") is None
    assert remotecommand.chosen_protocol("") is None


def test_frames_carry_their_channel_in_the_first_byte():
    assert remotecommand.frame(remotecommand.STDOUT, b"hi") == b"\x01hi"
    assert remotecommand.parse(b"\x00input") == (0, b"input")
    assert remotecommand.parse("\x00text from the Python client") == (0, b"text from the Python client")
    assert remotecommand.parse(bytes([255, 0])) == (remotecommand.CLOSE, b"\x00")
    with pytest.raises(ProtocolError):
        remotecommand.parse(b"")


def test_resize_messages():
    assert remotecommand.resize(b'{"Width": 97, "Height": 33}') == (97, 33)
    for bad in (b"{}", b"not json", b'{"Width": -1, "Height": 3}', b'{"Width": "x", "Height": 3}'):
        with pytest.raises(ProtocolError):
            remotecommand.resize(bad)


def test_exit_status_is_what_kubectl_reads_the_exit_code_from():
    assert remotecommand.exit_status(0, ["true"]) == {"metadata": {}, "status": "Success"}
    failed = remotecommand.exit_status(7, ("sh", "-c", "exit 7"))
    assert failed["status"] == "Failure" and failed["reason"] == "NonZeroExitCode"
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]
    json.dumps(failed)  # sent as JSON on channel 3


# Logs


def test_log_queries():
    assert podlogs.log_query({}) == podlogs.LogQuery()
    q = podlogs.log_query({"tailLines": "5", "limitBytes": "100", "follow": "true", "previous": "false"})
    assert q == podlogs.LogQuery(tail_lines=5, limit_bytes=100, follow=True, previous=False)


@pytest.mark.parametrize("query, says", [
    ({"tailLines": "x"}, "tailLines must be an integer"),
    ({"tailLines": "-1"}, "tailLines must be at least 0"),
    ({"limitBytes": "0"}, "limitBytes must be at least 1"),
    ({"follow": "maybe"}, "follow must be true or false"),
    ({"timestamps": "true"}, "use --tail"),
    ({"sinceSeconds": "60"}, "use --tail"),
])
def test_log_queries_refused_say_why(query, says):
    with pytest.raises(podlogs.LogQueryError, match=says):
        podlogs.log_query(query)


def test_last_lines():
    data = b"a\nb\nc\n"
    assert podlogs.last_lines(data, None) == data
    assert podlogs.last_lines(data, 2) == b"b\nc\n"
    assert podlogs.last_lines(data, 0) == b""
    assert podlogs.last_lines(data, 10) == data
    assert podlogs.last_lines(b"a\nno newline", 1) == b"no newline"


@pytest.mark.parametrize("data", [b"", b"a\n", b"a\nb\nc\n", b"a\nno newline", b"\n\n\n", b"x" * 300 + b"\ny\n" * 200])
@pytest.mark.parametrize("n", [None, 0, 1, 2, 3, 150, 1000])
def test_tail_offset_reads_back_from_the_end_as_last_lines_counts(tmp_path, data, n):
    path = tmp_path / "log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        assert data[podlogs.tail_offset(f, n, block=7):] == podlogs.last_lines(data, n)


def test_a_restarted_instance_keeps_the_last_ones_log_as_previous(tmp_path):
    pod = tmp_path / "pod"
    for i, name in enumerate(("main", "side")):
        ctr = pod / "containers" / str(i)
        ctr.mkdir(parents=True)
        (ctr / "name").write_text(name)
        podlogs.start_instance(ctr, None)
    ctrs = podlogs.containers(pod)
    assert list(ctrs) == ["main", "side"] and podlogs.index(ctrs["side"]) == 1
    assert podlogs.read(ctrs["main"]) == b"" and not podlogs.log_file(ctrs["main"], previous=True).exists()
    podlogs.log_file(ctrs["main"]).write_bytes(b"first run\n")
    kept = podlogs.keep_previous(pod)
    assert kept == {"0": b"first run\n", "1": b""}
    podlogs.start_instance(ctrs["main"], kept["0"])
    assert podlogs.read(ctrs["main"], previous=True) == b"first run\n" and podlogs.read(ctrs["main"]) == b""


# The API server's side


def pod_object(containers=("main",), node="n1", phase="Running"):
    return {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": c} for c in containers]},
            "status": {"phase": phase}}


def test_the_container_of_a_request():
    assert podproxy.pod_container(pod_object(), None, "log") == "main"
    assert podproxy.pod_container(pod_object(("a", "b")), "b", "exec") == "b"


@pytest.mark.parametrize("pod, container, sub, says", [
    (pod_object(("a", "b")), None, "log", r"a container name must be specified for pod p, choose one of: \[a b\]"),
    (pod_object(), "x", "log", "container x is not valid for pod p"),
    (pod_object(phase="Succeeded"), "main", "exec", "cannot exec into a container in a completed pod"),
    (pod_object(node=None), "main", "log", 'container "main" in pod "p" is waiting to start'),
])
def test_the_container_of_a_request_refused(pod, container, sub, says):
    with pytest.raises(APIError, match=says) as err:
        podproxy.pod_container(pod, container, sub)
    assert err.value.code == 400


def test_the_kubelet_of_a_node():
    node = {"metadata": {"name": "n1"}, "status": node_status(40123)}
    node["status"]["addresses"] += [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}]
    assert podproxy.kubelet_location(node) == ("localhost", 40123)
    node["status"]["addresses"] = [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}]
    assert podproxy.kubelet_location(node) == ("10.0.0.1", 40123)
    with pytest.raises(APIError, match="does not say where its kubelet listens") as err:
        podproxy.kubelet_location({"metadata": {"name": "n1"}, "status": {"addresses": node["status"]["addresses"]}})
    assert err.value.code == 503


def test_kubelet_paths_pass_on_only_what_the_kubelet_reads():
    q = MultiDict([("container", "c"), ("tailLines", "3"), ("follow", "true"), ("pretty", "1")])
    assert podproxy.kubelet_path("log", "ns", "p", "c", q) == "/containerLogs/ns/p/c?tailLines=3&follow=true"
    q = MultiDict([("command", "sh"), ("command", "-c"), ("command", "echo a&b"), ("stdout", "true")])
    assert podproxy.kubelet_path("exec", "ns", "p", "c", q) == \
        "/exec/ns/p/c?command=sh&command=-c&command=echo+a%26b&stdout=true"


def test_attach_and_port_forward_are_refused_with_what_to_use():
    podproxy.refuse_unserved("log")
    podproxy.refuse_unserved("exec")
    with pytest.raises(APIError, match="kubectl exec -it"):
        podproxy.refuse_unserved("attach")
    with pytest.raises(APIError, match="pod's IP"):
        podproxy.refuse_unserved("portforward")


def test_sandbox_logs_reads_the_same_files(tmp_path):
    from sandbox.sandbox import Sandbox

    uid = "0123456789abcdef"
    (tmp_path / "kubelet.json").write_text(json.dumps({"pods": {uid: {"uid": uid, "namespace": "default", "name": "p"}}}))
    pod = tmp_path / "pods" / f"default_p_{uid[:8]}"
    for i, (name, previous, current) in enumerate((("main", b"old 1\nold 2\n", b"new 1\n"), ("side", None, b"s\n"))):
        ctr = pod / "containers" / str(i)
        ctr.mkdir(parents=True)
        (ctr / "name").write_text(name)
        podlogs.start_instance(ctr, previous)
        podlogs.log_file(ctr).write_bytes(current)
    (pod / "log").write_text("runc-shim: container main exited with status 1; stopping the pod\n")
    box = Sandbox(tmp_path)
    assert box.logs("p").splitlines() == ["old 1", "old 2", "--- the pod restarted ---", "new 1",
                                          "runc-shim: container main exited with status 1; stopping the pod"]
    assert box.logs("p", container="side", tail=2).splitlines()[0] == "s"
    with pytest.raises(KeyError, match="containers: main, side"):
        box.logs("p", container="nope")
