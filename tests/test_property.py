"""Random specs: the renderer returns valid output or raises InvalidSpec, never anything else."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.apiserver import schema
from slurmk8s import versions
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.validate import OWNED_KEYS
from slurmk8s.render import ClusterKeys, TopologyNode, config_files, render
from slurmk8s.render.config import PROLOG_SLURMCTLD_FILE

from .reach import reached, reaches
from .test_corpus import _check_name as check_name

KEYS = ClusterKeys.generate()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x@y"

# Each spec is drawn either clean (valid values only, so the renderer runs: every
# clean spec is valid) or hostile (injection attempts and out-of-range values mixed in).
HOSTILE = st.sampled_from(
    ["", " ", "a\nb", "x#y", "k=v", "a b", "{x}", "é", "-a", "a" * 80, "a\r", "a,b", "../x", "\t"]
)
DNS = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


def pick(clean: bool, good, bad):
    return good if clean else st.one_of(good, bad)


@st.composite
def node_sets(draw, clean):
    name = pick(clean, DNS, HOSTILE)
    ns = {"name": draw(name), "replicas": draw(pick(clean, st.integers(0, 3), st.integers(-1, 2000))),
          "cpus": draw(pick(clean, st.integers(1, 8), st.just(0))),
          "memory": draw(pick(clean, st.sampled_from(["1Gi", "512Mi", "1.5Gi", "4G"]),
                              st.sampled_from(["x", "1 Gi", "4GB", "2"])))}
    if draw(st.booleans()):
        ns["gpus"] = {"type": draw(pick(clean, st.sampled_from(["h100", "a100_80g", "gpu"]), HOSTILE)),
                      "count": draw(pick(clean, st.integers(1, 8), st.integers(-1, 99)))}
    if draw(st.booleans()):
        ns["features"] = draw(st.lists(pick(clean, DNS, HOSTILE), max_size=2))
    if draw(st.booleans()):
        ns["nodeSelector"] = draw(st.dictionaries(
            pick(clean, st.sampled_from(["zone", "example.com/rack"]), st.just("bad key")), DNS, max_size=2))
    return ns


@st.composite
def partitions(draw, clean, known):
    p = {"name": draw(pick(clean, DNS, HOSTILE)),
         "maxTime": draw(pick(clean, st.sampled_from(["UNLIMITED", "60", "1:00:00", "2-00:00:00", "1-12"]),
                              st.sampled_from(["soon", "1 h", "1:2:3:4"]))),
         "priority": draw(pick(clean, st.integers(0, 65533), st.integers(-5, 70000)))}
    if known:
        p["nodeSets"] = draw(st.lists(pick(clean, st.sampled_from(known), DNS), max_size=2, unique=True))
    elif not clean:
        p["nodeSets"] = draw(st.lists(DNS, max_size=2, unique=True))
    if draw(st.booleans()):
        p["preemption"] = {"mode": draw(pick(clean, st.sampled_from(["off", "requeue", "cancel"]), st.just("on"))),
                           "graceTime": draw(pick(clean, st.integers(0, 120), st.just(-1)))}
    return p


@st.composite
def specs(draw, clean=None):
    clean = draw(st.booleans()) if clean is None else clean
    sets = draw(st.lists(node_sets(clean), max_size=3, unique_by=lambda n: n["name"]))
    if clean:  # a node set's name is the feature that puts a node in it: no other may list it
        for ns in (ns for ns in sets if "features" in ns):
            ns["features"] = [f for f in ns["features"] if f not in {s["name"] for s in sets}]
    spec = {"nodeSets": sets}
    parts = draw(st.lists(partitions(clean, [s["name"] for s in sets]), max_size=3, unique_by=lambda p: p["name"]))
    if parts:
        parts[0]["default"] = True
    spec["partitions"] = parts
    spec["slurm"] = {"version": draw(pick(clean, st.sampled_from(versions.SUPPORTED),
                                          st.sampled_from(["21.08", "23.02", "24.11.3", "x"])))}
    spec["login"] = {"users": draw(st.lists(st.fixed_dictionaries({
        "name": pick(clean, DNS.filter(lambda n: n not in ("root", "bin", "sys", "man", "lp")), HOSTILE),
        "uid": pick(clean, st.integers(1000, 60000), st.integers(0, 70000)),
        "sshPublicKeys": st.lists(pick(clean, st.just(KEY), st.sampled_from([KEY + "\nx", "nope"])),
                                  min_size=1, max_size=2),
    }), max_size=2, unique_by=(lambda u: u["name"], lambda u: u["uid"])))}
    memory_knob = draw(st.sampled_from(["CR_Core", "CR_Core_Memory", "CR_CPU"]))
    spec["slurmConfig"] = {
        "extraLines": draw(st.lists(pick(clean, st.sampled_from(["SchedulerTimeSlice=60", "Waittime=5"]),
                                         st.sampled_from(["SlurmUser=root", "A=b c", "X=1\nY=2", "#x=1"])),
                                    max_size=2, unique=True)),
        "schedulerParameters": draw(st.lists(pick(clean, st.sampled_from(["bf_continue", "bf_max_job_test=5"]),
                                                  st.sampled_from(["a b", "x#", "a,b"])), max_size=2)),
        "maxNodeCount": draw(pick(clean, st.integers(16, 4096), st.integers(-1, 3))),
        "selectTypeParameters": memory_knob,
    }
    if memory_knob.endswith("Memory") and (clean or draw(st.booleans())):
        spec["slurmConfig"]["defMemPerCPU"] = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        spec["sharedStorage"] = {
            "volumes": [{"name": "shared", "size": "1Gi",
                         "mountPath": draw(pick(clean, st.sampled_from(["/shared", "/data"]),
                                                st.sampled_from(["/etc", "/a b", "/x/../etc"])))}],
        }
        mount = spec["sharedStorage"]["volumes"][0]["mountPath"]
        spec["sharedStorage"]["checkpointDir"] = draw(pick(clean, st.just(mount + "/ckpt"), st.just("/elsewhere")))
    release = versions.RELEASES.get(spec["slurm"]["version"])
    if draw(st.booleans()) and (not clean or release.topology_places_dynamic_nodes):
        spec["topology"] = {"labelKeys": draw(st.lists(
            pick(clean, st.sampled_from(["net/spine", "net/leaf"]), st.just("bad key")),
            min_size=1, max_size=2, unique=True))}
    spec["restApi"] = {"enabled": draw(st.booleans())}
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
            "metadata": {"name": draw(pick(clean, DNS, HOSTILE)), "namespace": "ns1"}, "spec": spec}


SETTING = re.compile(r"[A-Za-z]+=\S+( [A-Za-z]+=\S+)*")


def assert_config_is_well_formed(cluster, files: dict[str, str]) -> None:
    extra_keys = {line.split("=", 1)[0].lower() for line in cluster.spec.slurm_config.extra_lines}
    counts = {"partitionname": 0, "nodeset": 0}
    for fname, text in files.items():
        assert text.endswith("\n")
        if fname in ("job_submit.lua", PROLOG_SLURMCTLD_FILE):  # programs: test_corpus.py (U14) checks their code
            continue
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            assert SETTING.fullmatch(line), f"{fname}: malformed line {line!r}"
            key = line.split("=", 1)[0].lower()
            if fname == "slurm.conf":
                assert key in OWNED_KEYS or key in extra_keys, f"unexpected key in {line!r}"
                if key in counts:
                    counts[key] += 1
    assert counts["partitionname"] == len(cluster.spec.partitions)
    assert counts["nodeset"] == len(cluster.spec.node_sets)


@reaches(renders=0.3, refused=0.1)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_random_specs_render_valid_output_or_raise_field_errors(doc):
    try:
        cluster = load_cluster(doc)
    except InvalidSpec as exc:
        reached("refused")
        for err in exc.errors:
            assert re.match(r"(spec|metadata)(\.|$)", err.path), err
            assert err.message.strip(), err
        return
    reached("renders")
    nodes = [TopologyNode(f"{cluster.name}-n{i}", {"net/spine": f"s{i % 2}", "net/leaf": f"l{i}"}) for i in range(3)]
    assert_config_is_well_formed(cluster, config_files(cluster, nodes))
    objs = render(cluster, KEYS, nodes)
    for o in objs:
        kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)
        check_name(o)  # valid for its kind: Services DNS-1035, StatefulSets short enough for their pods


# -- the validator and the CRD agree ---------------------------------------------------------

CRD_SCHEMA = yaml.safe_load(
    (Path(__file__).resolve().parent.parent / "charts/slurmk8s/files/crds/slurmclusters.slurmk8s.dev.yaml").read_text()
)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
#: Values of the wrong type, length or alphabet, put in place of one scalar of a spec.
MUTANTS = st.sampled_from(["3", True, 3.0, None, "x" * 20_000, "١٢", "12\u200b", [], {}, -1, 2**70, "a\nb"])


def _scalars(node, loc=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _scalars(v, (*loc, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _scalars(v, (*loc, i))
    else:
        yield loc


def _neighbours(value) -> list:
    """Values a lax reader may take for ``value``: the same in another type or form."""
    if isinstance(value, bool):
        return [int(value), str(value).lower(), None]
    if isinstance(value, int):
        return [str(value), float(value), value + 0.5, True, None]
    if isinstance(value, str):
        return [value.upper(), f" {value}", f"{value}\n", [value], None]
    return [None]


@st.composite
def mutated_specs(draw):
    """A valid spec with one scalar replaced: by the same value in another type or
    form, which a lax validator might accept, or by a value of the wrong kind."""
    doc = draw(specs(clean=True))
    spots = [loc for loc in _scalars(doc["spec"]) if loc]
    if spots:
        loc = draw(st.sampled_from(spots))
        parent = doc["spec"]
        for part in loc[:-1]:
            parent = parent[part]
        parent[loc[-1]] = draw(st.one_of(st.sampled_from(_neighbours(parent[loc[-1]])), MUTANTS))
    return doc


@reaches(accepted=0.12)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_what_the_validator_accepts_the_crd_schema_accepts(doc):
    """Schema-level agreement: a spec `slurmk8s validate` passes is one the API
    server stores as given (no error, nothing pruned). The CRD may accept more:
    the rules across fields are the validator's alone."""
    try:
        load_cluster(doc)
    except InvalidSpec:
        return
    reached("accepted")
    outcome = schema.process(doc, CRD_SCHEMA)
    assert not outcome.errors and not outcome.unknown, (outcome.errors, outcome.unknown)
