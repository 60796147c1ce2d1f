"""Model-version rollouts (slurmk8s.bridge.rollout): the pure patch and path
checks exhaustively and by property, the round through the bridge's Kube
client with its HTTP faked, and once against the Kubernetes stand-in."""

from __future__ import annotations

import copy
import posixpath
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.apiserver.patch import merge_patch
from slurmk8s.api.cluster import PROJECT_REPOSITORY
from slurmk8s.bridge.rollout import (
    INVALID_REASON,
    MODEL_DIR_ANNOTATION,
    MODEL_VERSION_ANNOTATION,
    BadModelDir,
    apply_rollouts,
    check_model_dir,
    parse_latest,
    rollout_patch,
)
from slurmk8s.kube import ApiError, Kube
from slurmk8s.published_model import VERSION

from .reach import reached, reaches

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ["/shared/checkpoints"]
MODEL_DIR = "/shared/checkpoints/researcher/train"


def deployment(name: str = "serve", namespace: str = "default", model_dir: str | None = MODEL_DIR,
               version: str | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if model_dir is not None:
        meta["annotations"] = {MODEL_DIR_ANNOTATION: model_dir}
    template: dict = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    if version is not None:
        template["metadata"]["annotations"] = {MODEL_VERSION_ANNOTATION: version, "other": "kept"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {"template": template}}


# -- rollout_patch --------------------------------------------------------------------------------


def test_a_new_version_sets_the_pod_template_annotation():
    assert rollout_patch(deployment(), "step-000020") == {
        "spec": {"template": {"metadata": {"annotations": {MODEL_VERSION_ANNOTATION: "step-000020"}}}}}
    assert rollout_patch(deployment(version="step-000010"), "step-000020") is not None


@pytest.mark.parametrize("dep, version", [
    (deployment(model_dir=None), "step-000020"),          # follows no model directory
    (deployment(), None),                                 # nothing published
    (deployment(version="step-000020"), "step-000020"),   # already at that version
    (deployment(), "../x"),                               # not a version name
    (deployment(), ""),
    (deployment(), "a b"),
    (deployment(), ".hidden"),
    (deployment(), "x" * 129),
])
def test_no_patch(dep, version):
    assert rollout_patch(dep, version) is None


@pytest.mark.parametrize("dep", [
    {},
    {"metadata": {"annotations": {MODEL_DIR_ANNOTATION: MODEL_DIR}}},                   # no spec
    {"metadata": {"annotations": {MODEL_DIR_ANNOTATION: MODEL_DIR}}, "spec": {"template": None}},
    {"metadata": {"annotations": {MODEL_DIR_ANNOTATION: MODEL_DIR}},
     "spec": {"template": {"metadata": {"annotations": None}}}},
    {"metadata": {"annotations": None}},
    {"metadata": None},
])
def test_partial_objects_do_not_break_it(dep):
    patch = rollout_patch(dep, "v1")
    follows = MODEL_DIR_ANNOTATION in ((dep.get("metadata") or {}).get("annotations") or {})
    assert (patch is not None) == follows


def test_the_input_is_not_changed():
    dep = deployment(version="step-000010")
    before = copy.deepcopy(dep)
    rollout_patch(dep, "step-000020")
    assert dep == before


versions = st.from_regex(VERSION, fullmatch=True)


@reaches(patched=0.15)
@given(old=st.none() | versions, new=st.none() | st.text(max_size=20) | versions)
def test_applying_the_patch_reaches_the_version_and_then_nothing_more_is_patched(old, new):
    dep = deployment(version=old)
    patch = rollout_patch(dep, new)
    if patch is None:
        assert new is None or not VERSION.fullmatch(new) or new == old
        return
    reached("patched")
    rolled = merge_patch(dep, patch)
    annotations = rolled["spec"]["template"]["metadata"]["annotations"]
    assert annotations[MODEL_VERSION_ANNOTATION] == new
    if old is not None:
        assert annotations["other"] == "kept"  # a merge patch leaves the other annotations
    assert rolled["spec"]["template"]["spec"] == dep["spec"]["template"]["spec"]
    assert rollout_patch(rolled, new) is None


# -- check_model_dir ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    MODEL_DIR, "/shared/checkpoints", "/shared/checkpoints/a", "/shared/checkpoints/a..b/c.d", "/shared/checkpoints/…",
])
def test_model_dirs_inside_a_root_are_accepted(path):
    assert check_model_dir(path, ROOTS) == path


@pytest.mark.parametrize("path, why", [
    ("", "is empty"),
    (None, "is empty"),
    (42, "is empty"),
    ("shared/checkpoints/a", "not an absolute path"),
    ("/shared/checkpoints/../../etc", "contains '..'"),
    ("/shared/checkpoints/a/..", "contains '..'"),
    ("/shared/checkpoints/./a", "not a normalised path"),
    ("/shared/checkpoints//a", "not a normalised path"),
    ("/shared/checkpoints/a/", "not a normalised path"),
    ("//shared/checkpoints/a", "not a normalised path"),
    ("/shared/checkpoints/a\nb", "control character"),
    ("/shared/checkpoints/a\x00", "control character"),
    ("/shared/checkpoints-evil/a", "outside the checkpoint directories"),  # a prefix is not a parent
    ("/shared", "outside the checkpoint directories"),
    ("/etc", "outside the checkpoint directories"),
    ("/" + "a" * 5000, "longer than"),
])
def test_bad_model_dirs_are_refused_with_a_reason(path, why):
    with pytest.raises(BadModelDir, match=why):
        check_model_dir(path, ROOTS)


def test_no_roots_means_nothing_is_allowed():
    with pytest.raises(BadModelDir, match="no SlurmCluster has a checkpointDir"):
        check_model_dir(MODEL_DIR, [])
    with pytest.raises(BadModelDir, match="outside"):
        check_model_dir(MODEL_DIR, ["shared/checkpoints", "/shared/./checkpoints"])  # bad roots are ignored


_PARTS = st.lists(st.sampled_from(["a", "b", ".", "..", "", "checkpoints", "shared", "x.y", "\n"]), max_size=8)


@reaches(accepted=0.15, refused=0.3)
@settings(max_examples=500)
@given(st.one_of(_PARTS, _PARTS.map(lambda p: ["shared", "checkpoints", *p]),  # often below the root
                 st.lists(st.sampled_from(["a", "b", "x.y", "checkpoints"]), max_size=4)
                 .map(lambda p: ["shared", "checkpoints", *p])))
def test_an_accepted_path_is_normalised_and_lies_inside_a_root(parts):
    path = "/" + "/".join(parts)
    try:
        check_model_dir(path, ROOTS)
    except BadModelDir:
        reached("refused")
        return
    reached("accepted")
    assert posixpath.normpath(path) == path and ".." not in path.split("/")
    assert path == ROOTS[0] or path.startswith(ROOTS[0] + "/")


@reaches(version=0.2)
@given(st.one_of(st.text(max_size=300),
                 st.tuples(st.sampled_from(["", " ", "\n", "\t"]), versions, st.sampled_from(["", "\n", "  ", "/"]))
                 .map("".join)))
def test_parse_latest_gives_a_version_name_or_none(text):
    version = parse_latest(text)
    if version is not None:
        reached("version")
    assert version is None or (VERSION.fullmatch(version) and version == text.strip())


@pytest.mark.parametrize("text, version", [
    ("step-000020\n", "step-000020"), ("  v1  ", "v1"), ("", None), ("a/b", None), ("..", None),
    ("v1\nv2", None), ("x" * 1000, None),
])
def test_parse_latest(text, version):
    assert parse_latest(text) == version


# -- apply_rollouts against fakes -----------------------------------------------------------------


class FakeKube(Kube):
    """The bridge's Kube client with its HTTP replaced: the paths, content
    types and errors of the real client, Deployments and Events in memory."""

    def __init__(self, *deployments: dict):
        self.field_manager = "slurmk8s-bridge"
        self.deployments = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in deployments}
        self.patches: list[tuple[str, str, dict, str]] = []
        self.events: dict[str, dict] = {}
        self.fail_patch = False

    def request(self, method, path, *, query=(), body=None, content_type="application/json", timeout=None):
        parts = path.split("/")
        if method == "GET" and parts[-1] == "deployments":
            namespace = parts[-2] if "namespaces" in parts else None
            return {"items": [copy.deepcopy(d) for (ns, _), d in self.deployments.items()
                              if namespace in (None, ns)]}
        if method == "PATCH" and parts[-2] == "deployments":
            if self.fail_patch:
                raise RuntimeError("connection refused")
            namespace, name = parts[-3], parts[-1]
            self.patches.append((namespace, name, body, content_type))
            key = (namespace, name)
            self.deployments[key] = merge_patch(self.deployments[key], body)
            return self.deployments[key]
        if method == "POST" and parts[-1] == "events":
            name = body["metadata"]["name"]
            if name in self.events:
                raise ApiError(method, path, 409, "AlreadyExists", f"events {name!r} already exists")
            self.events[name] = body
            return body
        raise AssertionError(f"unexpected request {method} {path}")


def reader(files: dict[str, str]):
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        value = files[path]
        if isinstance(value, Exception):
            raise value
        return value
    return read


def run(kube, files, events=False, **kw):
    return apply_rollouts(kube, reader(files), ROOTS, events=events, **kw)


def test_a_round_rolls_what_published_a_new_version_and_leaves_the_rest():
    apps = FakeKube(
        deployment("new"),
        deployment("current", model_dir=f"{ROOTS[0]}/r/current", version="v2"),
        deployment("unpublished", model_dir=f"{ROOTS[0]}/r/none"),
        deployment("plain", model_dir=None),
        deployment("elsewhere", namespace="other", model_dir=f"{ROOTS[0]}/r/other"),
    )
    files = {f"{MODEL_DIR}/LATEST": "step-000020\n", f"{ROOTS[0]}/r/current/LATEST": "v2\n",
             f"{ROOTS[0]}/r/other/LATEST": "v9"}
    report = run(apps, files)
    assert report.rolled == {"default/new": "step-000020", "other/elsewhere": "v9"}
    assert report.unpublished == ["default/unpublished"] and not report.invalid and not report.failed
    assert [(ns, name, ct) for ns, name, _, ct in apps.patches] == [
        ("default", "new", "application/merge-patch+json"), ("other", "elsewhere", "application/merge-patch+json")]
    # The next round has nothing to do.
    assert run(apps, files).rolled == {}
    assert len(apps.patches) == 2
    # One namespace only.
    files[f"{MODEL_DIR}/LATEST"] = "step-000025"
    files[f"{ROOTS[0]}/r/other/LATEST"] = "v10"
    assert run(apps, files, namespace="other").rolled == {"other/elsewhere": "v10"}


def test_a_bad_annotation_gets_one_event_and_nothing_is_read_or_patched():
    apps = FakeKube(deployment("evil", model_dir="/shared/checkpoints/../../run/secrets"))
    read: list[str] = []

    def spy(path):
        read.append(path)
        raise FileNotFoundError(path)

    for _ in range(3):
        report = apply_rollouts(apps, spy, ROOTS)
        assert list(report.invalid) == ["default/evil"] and "contains '..'" in report.invalid["default/evil"]
    assert read == [] and apps.patches == []
    (event,) = apps.events.values()
    assert event["type"] == "Warning" and event["reason"] == INVALID_REASON
    assert event["involvedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "evil",
                                       "namespace": "default", "uid": "uid-evil"}
    assert "slurmk8s.dev/model-dir" in event["message"] and "not rolled" in event["message"]


def test_without_an_events_client_a_bad_annotation_is_only_logged():
    apps = FakeKube(deployment("rel", model_dir="relative/dir"))
    assert "not an absolute path" in run(apps, {}).invalid["default/rel"]


def test_read_and_patch_failures_are_reported_and_do_not_stop_the_round():
    apps = FakeKube(deployment("a", model_dir=f"{ROOTS[0]}/a"), deployment("b", model_dir=f"{ROOTS[0]}/b"))
    files = {f"{ROOTS[0]}/a/LATEST": PermissionError("denied"), f"{ROOTS[0]}/b/LATEST": "v1"}
    report = run(apps, files)
    assert "denied" in report.failed["default/a"] and report.rolled == {"default/b": "v1"}
    apps.fail_patch = True
    files[f"{ROOTS[0]}/b/LATEST"] = "v2"
    report = run(apps, files)
    assert "connection refused" in report.failed["default/b"] and report.rolled == {}


def test_a_latest_that_names_no_version_is_unpublished():
    apps = FakeKube(deployment())
    assert run(apps, {f"{MODEL_DIR}/LATEST": "../../etc/passwd"}).unpublished == ["default/serve"]
    assert apps.patches == []


# -- against the Kubernetes stand-in --------------------------------------------------------------------


def test_the_example_serving_deployment_rolls_in_the_stand_in(tmp_path):
    from .apiserver.conftest import start_server

    cluster = start_server(tmp_path)
    try:
        docs = list(yaml.safe_load_all((ROOT / "examples/serving.yaml").read_text()))
        dep = next(d for d in docs if d["kind"] == "Deployment")
        cluster.apps.create_namespaced_deployment("default", dep)
        bad = copy.deepcopy(dep)
        bad["metadata"]["name"] = "bad-serve"
        bad["metadata"]["annotations"][MODEL_DIR_ANNOTATION] = "/etc"
        cluster.apps.create_namespaced_deployment("default", bad)

        storage = tmp_path / "shared"
        model_dir = dep["metadata"]["annotations"][MODEL_DIR_ANNOTATION]
        (storage / model_dir.removeprefix("/shared/")).mkdir(parents=True)

        def read(path: str) -> str:  # the shared volume, mounted at /shared in the Slurm pods
            return (storage / path.removeprefix("/shared/")).read_text()

        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        report = apply_rollouts(kube, read, ROOTS)
        assert report.unpublished == ["default/train-serve"] and list(report.invalid) == ["default/bad-serve"]
        (storage / model_dir.removeprefix("/shared/") / "LATEST").write_text("step-000020\n")
        assert apply_rollouts(kube, read, ROOTS).rolled == {"default/train-serve": "step-000020"}
        live = cluster.apps.read_namespaced_deployment("train-serve", "default")
        assert live.spec.template.metadata.annotations == {MODEL_VERSION_ANNOTATION: "step-000020"}
        assert live.metadata.generation == 2  # a template change: the Deployment rolls
        assert apply_rollouts(kube, read, ROOTS).rolled == {}
        events = [e for e in cluster.core.list_namespaced_event("default").items if e.reason == INVALID_REASON]
        assert [(e.type, e.involved_object.kind, e.involved_object.name) for e in events] == [
            ("Warning", "Deployment", "bad-serve")]
    finally:
        cluster.api_client.close()
        cluster.srv.stop()


def test_the_bridges_round_reports_the_rollouts_that_failed(example_doc):
    """Issue 41, item 9: the bridge dropped rollout failures from its round
    report; they are reported as its other failures are (report, Event once,
    metric, log)."""
    from slurmk8s.bridge import metrics
    from slurmk8s.bridge.loop import Bridge, RoundReport
    from slurmk8s.slurm import AgentError

    namespace = example_doc["metadata"].get("namespace", "default")
    apps = FakeKube(deployment("unread", namespace=namespace, model_dir=f"{ROOTS[0]}/unread"),
                    deployment("refused", namespace=namespace, model_dir=f"{ROOTS[0]}/refused"))
    apps.fail_patch = True

    class View:
        def clusters(self, ns):
            return [copy.deepcopy(example_doc)]

    class Agent:
        def published(self, model_dir: str) -> str:
            if model_dir.endswith("/unread"):
                raise AgentError("the Slurm agent answered 500: boom", 500)
            return "v1"

    bridge = Bridge.__new__(Bridge)  # only what the rollouts use
    bridge.namespaces, bridge.view, bridge.kube, bridge._unanswered = (), View(), apps, set()
    bridge._agent_of = lambda cluster: Agent()
    bridge.trusted_repositories = (PROJECT_REPOSITORY,)
    failed = metrics.ROLLOUTS.labels("failed")
    before = failed._value.get()
    for _ in range(2):
        report = RoundReport()
        bridge._rollouts(report)
        assert sorted(report.rollouts_failed) == [f"{namespace}/refused", f"{namespace}/unread"]
        assert "boom" in report.rollouts_failed[f"{namespace}/unread"]
        assert "connection refused" in report.rollouts_failed[f"{namespace}/refused"]
    assert failed._value.get() - before == 4
    # One Warning Event per Deployment and what failed, however many rounds.
    assert sorted((e["reason"], e["involvedObject"]["name"]) for e in apps.events.values()) == [
        ("RolloutFailed", "refused"), ("RolloutFailed", "unread")]
