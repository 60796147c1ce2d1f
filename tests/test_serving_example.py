"""examples/serving.yaml: valid Kubernetes objects that serve what the example
SlurmCluster's training job publishes, from the same claim at the same path."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from slurmk8s.api import load_cluster
from slurmk8s.bridge.rollout import MODEL_DIR_ANNOTATION, check_model_dir
from slurmk8s.render import names

from .conftest import EXAMPLE, ROOT
from .test_render import K8S_VERSIONS

SERVING = ROOT / "examples" / "serving.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(SERVING.read_text()) if d}


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_it_validates_against_the_official_kubernetes_schemas(objects, k8s_version):
    assert set(objects) == {"Deployment", "Service"}
    for obj in objects.values():
        kubernetes_validate.validate(obj, k8s_version, strict=True)


def test_it_mounts_the_clusters_claim_read_only_where_the_slurm_pods_do(objects):
    cluster = load_cluster(yaml.safe_load(EXAMPLE.read_text()))
    storage = cluster.spec.shared_storage
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    shared = next(v for v in storage.volumes if v.mount_path == mount["mountPath"])
    assert volume["persistentVolumeClaim"] == {"claimName": names.shared_claim(cluster, shared.name), "readOnly": True}
    assert mount["readOnly"] is True
    assert objects["Deployment"]["metadata"]["namespace"] == cluster.namespace

    # It serves, and the bridge follows, what train.sh (job name train) of user researcher publishes.
    env = {e["name"]: e["value"] for e in container["env"]}
    model_dir = env["SLURMK8S_MODEL_DIR"]
    assert model_dir == f"{storage.checkpoint_dir}/{cluster.spec.login.users[0].name}/train"
    assert "#SBATCH --job-name=train" in (ROOT / "examples/train.sh").read_text()
    assert objects["Deployment"]["metadata"]["annotations"][MODEL_DIR_ANNOTATION] == model_dir
    assert check_model_dir(model_dir, [storage.checkpoint_dir]) == model_dir


def test_it_asks_for_a_gpu_and_is_ready_only_with_a_model(objects):
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    (port,) = container["ports"]
    assert port["containerPort"] == int(env["SLURMK8S_SERVE_PORT"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert pod["securityContext"]["runAsUser"] == 10001  # the serve image's user
    service = objects["Service"]["spec"]
    assert service["selector"].items() <= objects["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0]["targetPort"] == port["name"]
