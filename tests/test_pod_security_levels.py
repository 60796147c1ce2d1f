"""The Pod Security level each pod slurmk8s makes passes, judged by the API
stand-in's Pod Security admission (sandbox/apiserver/podsecurity.py): what
docs/install.md tells a platform engineer to label the namespace with."""

from __future__ import annotations

import re

import yaml

from sandbox.apiserver import podsecurity
from slurmk8s.api import load_cluster
from slurmk8s.render.manifests import lent_slurmd_pod, render

from .conftest import EXAMPLE, ROOT
from .test_chart import objects as chart_objects

#: The strictest level each component passes, as docs/install.md lists them.
LEVELS = {"slurmctld": "baseline", "slurmd": "baseline", "login": "baseline", "slurmrestd": "restricted",
          "slurmdbd": "baseline", "mariadb": "baseline", "lent slurmd": "baseline",
          "operator": "restricted", "bridge": "restricted"}


def strictest(pod: dict) -> str:
    return next(level for level in ("restricted", "baseline", "privileged") if not podsecurity.check(pod, level))


def pods(doc: dict, keys) -> dict[str, dict]:
    """component -> its pod spec, for every pod the cluster, the bridge and the chart make."""
    cluster = load_cluster(doc)
    objs = render(cluster, keys) + chart_objects({"bridge": {"enabled": True}})
    out = {}
    for o in objs:
        spec = o.get("spec") or {}
        if "template" in spec:
            tpl = spec["template"]
            component = tpl["metadata"]["labels"].get("app.kubernetes.io/component", "")
            main = tpl["spec"]["containers"][0]["name"]
            out[main if component not in ("operator", "bridge") else component] = tpl["spec"]
    out["lent slurmd"] = lent_slurmd_pod(cluster, "", node="gpu-7", labels={}, partition="gpu", shm_size="1Gi",
                                         taint_key="t", resources={"cpu": "8", "memory": "64Gi",
                                                                   "nvidia.com/gpu": "4"})["spec"]
    return out


def everything() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["restApi"] = {"enabled": True}
    return doc


def test_each_component_passes_the_level_the_install_guide_gives_it(keys):
    found = {name: strictest(spec) for name, spec in pods(everything(), keys).items()}
    assert found == LEVELS


def test_the_install_guide_lists_each_components_level():
    guide = (ROOT / "docs" / "install.md").read_text()
    rows = dict(re.findall(r"^ *\| (.+?) \| `(privileged|baseline|restricted)` \|", guide, re.M))
    assert rows == LEVELS


def test_cgroups_make_slurmd_privileged_and_nothing_else(keys):
    doc = everything()
    doc["spec"]["slurmConfig"] = {"cgroups": True}
    for p in doc["spec"]["partitions"]:
        p.pop("acceptLentNodes", None)  # a lent slurmd cannot run with cgroups (refused)
    found = {name: strictest(spec) for name, spec in pods(doc, keys).items()}
    assert found == {**LEVELS, "slurmd": "privileged"}
    (why,) = podsecurity.check(pods(doc, keys)["slurmd"], "baseline")
    assert why == ("privileged", 'container "slurmd" must not set securityContext.privileged=true')
