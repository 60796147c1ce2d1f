"""What `sandbox up` builds and pushes (sandbox.images.sandbox_refs), and
how the image store builds several at once, without building anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sandbox import images as rules
from sandbox.images import ImageError, Recipe
from sandbox.imagestore import ImageBuildFailed, ImageStore
from slurmk8s.manifest import clusters_in
from slurmk8s.render import ClusterKeys, render

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(p.parent.name for p in ROOT.glob("images/*/Dockerfile"))


# --- what `sandbox up` builds ---

def _example(**spec) -> tuple[object, list[dict]]:
    doc = yaml.safe_load((ROOT / "examples/slurmcluster.yaml").read_text())
    doc["spec"].update(spec)
    cluster = next(clusters_in([doc]))
    return cluster, render(cluster, ClusterKeys.generate())


def _examples_workloads() -> list[str]:
    docs = [d for f in ("examples/serving.yaml", "examples/monitoring/prometheus.yaml")
            for d in yaml.safe_load_all((ROOT / f).read_text()) if d]
    return rules.pod_images(docs)


def test_the_sandbox_builds_what_the_manifests_pods_the_chart_and_the_examples_workloads_run():
    cluster, objects = _example()
    release = cluster.spec.slurm.version
    refs = rules.sandbox_refs(objects, release, NAMES)
    rendered = rules.pod_images(objects)
    assert rendered, "the example renders no pods"
    assert set(refs) == {*rendered, *rules.tags("controller"), *_examples_workloads()}
    built = {rules.recipe_for(r, NAMES) for r in refs}
    # The example has no REST API and no directory: neither slurmrestd nor sssd (whose base,
    # on 26.05, is another suite's) nor ldap is built, and every image is of the release's suite.
    assert not {"slurmrestd", "sssd", "ldap"} & {r.name for r in built}
    assert {r.suite for r in built} == {rules.suite_for(release)}
    # The chart's controller image is built for the chart's release, whatever the cluster's.
    assert set(rules.tags("controller")) <= set(rules.sandbox_refs(objects, "24.11", NAMES))


def test_a_rest_api_and_a_directory_add_their_images():
    ldap = {"ldap": {"uris": ["ldaps://ldap.example.org"], "userSearchBase": "ou=people,dc=x",
                     "groupSearchBase": "ou=groups,dc=x", "minId": 65536, "maxId": 2**31 - 2}}
    cluster, objects = _example(restApi={"enabled": True}, identity=ldap)
    names_built = {rules.recipe_for(r, NAMES).name for r in rules.sandbox_refs(objects, "26.05", NAMES)}
    assert {"slurmrestd", "sssd"} <= names_built


def test_the_manifests_other_workloads_of_the_project_are_built_and_others_left_to_the_kubelet():
    _, objects = _example()
    site = [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "slapd"},
             "spec": {"template": {"spec": {"containers": [{"name": "slapd", "image": rules.tags("ldap")[0]}]}}}},
            {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "other"},
             "spec": {"jobTemplate": {"spec": {"template": {"spec": {
                 "initContainers": [{"name": "a", "image": "nginx"}],
                 "containers": [{"name": "b", "image": "registry.example.org/tools/x:1"}]}}}}}}]
    assert rules.pod_images(site) == [rules.tags("ldap")[0], "nginx", "registry.example.org/tools/x:1"]
    refs = rules.sandbox_refs([*objects, *site], "26.05", NAMES, extra=())
    assert rules.tags("ldap")[0] in refs
    assert not {"docker.io/library/nginx:latest", "registry.example.org/tools/x:1"} & set(refs)
    assert not set(_examples_workloads()) & set(refs), "extra=() builds no workload of the examples"


def test_sandbox_up_image_names_images_of_images_or_all():
    assert rules.image_names(["ldap", "serve", "ldap"], NAMES) == ["ldap", "serve"]
    assert sorted(rules.image_names(["serve", "all"], NAMES)) == NAMES
    with pytest.raises(ImageError, match="no image nginx: images/ has controller.* \\(or all\\)"):
        rules.image_names(["nginx"], NAMES)
    _, objects = _example()
    assert {rules.recipe_for(r, NAMES).name for r in rules.sandbox_refs(objects, "24.11", NAMES, ["all"])} == set(NAMES)


def test_sandbox_up_refuses_an_unknown_image_before_it_starts_anything(tmp_path):
    from click.testing import CliRunner

    from slurmk8s.cli import main

    state = tmp_path / "state"
    result = CliRunner().invoke(main, ["sandbox", "up", "-f", str(ROOT / "examples/slurmcluster.yaml"),
                                       "--state-dir", str(state), "--image", "nginx"])
    assert result.exit_code == 2 and "no image nginx: images/ has controller" in result.output, result.output
    assert not state.exists()


def test_the_longest_builds_start_first():
    recipes = [Recipe(n, "26.05") for n in ("serve", "login", "controller", "prometheus", "slurmd")]
    assert [r.name for r in rules.build_order(recipes)] == ["controller", "slurmd", "login", "serve", "prometheus"]


def _fake_builds(monkeypatch, tmp_path: Path, jobs: int, fail: str | None = None):
    """ImageStore._build over fake bases and builds: which started, in order, and which bases were done then."""
    import threading

    from sandbox import imagestore

    monkeypatch.setenv(imagestore.JOBS_ENV, str(jobs))
    monkeypatch.setattr(imagestore, "_need_tools", lambda: None)
    monkeypatch.setattr(imagestore, "_buildah_version", lambda: "buildah test")
    bases_together = threading.Barrier(2, timeout=10)  # both bases at once, or this times out
    builds_together = threading.Barrier(jobs, timeout=10)
    lock = threading.Lock()
    started: list[str] = []
    done_bases: set[str] = set()
    seen_bases: dict[str, set[str]] = {}

    def base(self, suite, progress, refresh):
        bases_together.wait()
        with lock:
            done_bases.add(suite.name)
        return f"sha256:{suite.name}"

    def build_one(self, r, key, path, progress):
        with lock:
            started.append(r.name)
            seen_bases[r.name] = set(done_bases)
        if r.name == fail:
            raise ImageBuildFailed(f"building {r.name} failed")
        if fail is None:
            builds_together.wait()
        path.mkdir(parents=True)
        (path / "image.json").write_text("{}")

    monkeypatch.setattr(ImageStore, "_ensure_base", base)
    monkeypatch.setattr(ImageStore, "_build_one", build_one)
    return ImageStore(tmp_path, repo=ROOT), started, seen_bases


def test_images_are_built_at_once_each_once_its_base_is_there_the_longest_first(tmp_path, monkeypatch):
    store, started, seen_bases = _fake_builds(monkeypatch, tmp_path, jobs=3)
    recipes = [Recipe(n, "26.05") for n in ("serve", "login", "sssd", "controller", "slurmd", "prometheus")]
    built = store._build(recipes, progress=lambda _: None)
    assert set(built) == set(recipes) and all((i.path / "image.json").exists() for i in built.values())
    # Three at a time (the barrier), the three longest first; each after its own base.
    assert set(started[:3]) == {"controller", "slurmd", "login"} and sorted(started) == sorted(r.name for r in recipes)
    assert all(r.suite.name in seen_bases[r.name] for r in recipes)
    assert {r.suite.name for r in recipes} == {"forky", "trixie"}  # the two bases were made at once (barrier)
    for r in recipes:
        assert store.lookup(r.tags[0]).path == built[r].path


def test_a_failed_build_stops_the_builds_not_started_and_is_raised(tmp_path, monkeypatch):
    store, started, _ = _fake_builds(monkeypatch, tmp_path, jobs=1, fail="slurmd")
    monkeypatch.setattr(ImageStore, "_ensure_base", lambda self, suite, progress, refresh: f"sha256:{suite.name}")
    recipes = [Recipe(n, "26.05") for n in ("serve", "login", "controller", "slurmd")]
    with pytest.raises(ImageBuildFailed, match="building slurmd failed"):
        store._build(recipes, progress=lambda _: None)
    assert started == ["controller", "slurmd"]
    assert store.lookup(Recipe("controller", "26.05").tags[0]) is not None
    assert store.lookup(Recipe("login", "26.05").tags[0]) is None


def test_the_builds_at_once_come_from_the_environment(monkeypatch):
    from sandbox import imagestore

    monkeypatch.delenv(imagestore.JOBS_ENV, raising=False)
    assert imagestore.build_jobs() == imagestore.BUILD_JOBS
    monkeypatch.setenv(imagestore.JOBS_ENV, "1")
    assert imagestore.build_jobs() == 1
    monkeypatch.setenv(imagestore.JOBS_ENV, "0")
    with pytest.raises(ImageError, match="SLURMK8S_IMAGE_JOBS='0'"):
        imagestore.build_jobs()


def test_a_push_of_references_needs_those_images_built_and_no_others(tmp_path, monkeypatch):
    """`sandbox up` pushes only what it built: a push of references names, when they were
    never built, those and only those (with the command that builds each)."""
    from sandbox import imagestore

    monkeypatch.setattr(imagestore.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    serve = rules.tags("serve")[0]
    with pytest.raises(ImageBuildFailed) as missing:
        ImageStore(tmp_path).push("127.0.0.1:5000", refs=[serve, serve])
    message = str(missing.value)
    assert f"{serve} (slurmk8s images build --slurm-version {rules.DEFAULT_SLURM} serve)" in message
    assert message.count(serve) == 1 and "slurmd" not in message
    with pytest.raises(ImageError, match="no image of images/ is tagged 'docker.io/library/nginx:latest'"):
        ImageStore(tmp_path).push("127.0.0.1:5000", refs=["nginx"])
    with pytest.raises(ImageBuildFailed) as release:
        ImageStore(tmp_path).push("127.0.0.1:5000", [rules.DEFAULT_SLURM])
    assert all(t in str(release.value) for n in NAMES for t in rules.tags(n))


def test_sandbox_up_ensures_the_images_the_cluster_renders_to_and_a_bad_one_fails_up(tmp_path, monkeypatch):
    from sandbox import Sandbox, SandboxFailed

    asked: list[list[str]] = []
    monkeypatch.setattr(ImageStore, "ensure", lambda self, refs, progress=None: asked.append(list(refs)) or {})
    said: list[str] = []
    cluster, objects = _example()
    docs = [cluster.model_dump(by_alias=True, exclude_none=True)]
    refs = Sandbox(tmp_path, progress=said.append)._images(cluster, docs, rules.SANDBOX_WORKLOADS)
    assert asked == [refs] and refs == rules.sandbox_refs(objects, cluster.spec.slurm.version, NAMES)
    built = sorted({rules.recipe_for(r, NAMES).name for r in refs})
    assert any(m.startswith(f"images: making sure {len(built)} images are built from images/ ({', '.join(built)};")
               for m in said), said
    other = {"kind": "Pod", "spec": {"containers": [{"name": "x", "image": "ghcr.io/slurmk8s/nothing:1"}]}}
    monkeypatch.undo()
    with pytest.raises(SandboxFailed, match="no image of images/ is tagged 'ghcr.io/slurmk8s/nothing:1'"):
        Sandbox(tmp_path)._images(cluster, [*docs, other], ())
