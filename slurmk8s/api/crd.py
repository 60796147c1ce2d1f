"""Generate CustomResourceDefinitions from the typed API models.

The pydantic JSON schema is turned into a *structural* OpenAPI v3 schema, as
apiextensions.k8s.io/v1 requires: every ``$ref`` inlined, ``Optional[X]``
written as plain ``X``, no ``title``, ``null`` left out of defaults, and every
node typed. ``charts/slurmk8s/files/crds/`` holds the committed result; a test
regenerates it and fails on any difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

from . import cluster, lending
from .celrules import rules_for

__all__ = ["CrdSpec", "CRDS", "crd", "all_crds", "dump_yaml", "SchemaError"]


class SchemaError(RuntimeError):
    """The model produced a schema that cannot be a structural CRD schema."""


@dataclass(frozen=True)
class CrdSpec:
    """What a CRD needs beyond its models."""

    kind: str
    plural: str
    singular: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    description: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ("slurmk8s",)
    printer_columns: tuple[dict, ...] = field(default_factory=tuple)
    scope: str = "Namespaced"


def _ready_column(description: str) -> dict:
    return {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": description,
    }


CRDS: tuple[CrdSpec, ...] = (
    CrdSpec(
        kind=cluster.KIND,
        plural=cluster.PLURAL,
        singular="slurmcluster",
        # Not "sc": every cluster's StorageClasses have it, and kubectl picks theirs.
        short_names=("slurm",),
        spec_model=cluster.SlurmClusterSpec,
        status_model=cluster.SlurmClusterStatus,
        description=(cluster.SlurmCluster.__doc__ or "").replace("\n    ", " ").strip(),
        printer_columns=(
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
             "description": "Summary of the cluster's state"},
            _ready_column("Whether every component is ready"),
            {"name": "Version", "type": "string", "jsonPath": ".spec.slurm.version",
             "description": "Slurm release"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodeCounts.total",
             "description": "Slurm nodes registered"},
            {"name": "Idle", "type": "integer", "jsonPath": ".status.nodeCounts.idle",
             "description": "Slurm nodes without jobs"},
            {"name": "Config", "type": "string", "jsonPath": ".status.configHash", "priority": 1,
             "description": "Hash of the applied Slurm config"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
    ),
    CrdSpec(
        kind=lending.KIND,
        plural=lending.PLURAL,
        singular="nodelendingpolicy",
        short_names=("nlp", "lending"),
        spec_model=lending.NodeLendingPolicySpec,
        status_model=lending.NodeLendingPolicyStatus,
        description=(lending.NodeLendingPolicy.__doc__ or "").replace("\n    ", " ").strip(),
        printer_columns=(
            {"name": "Cluster", "type": "string", "jsonPath": ".spec.clusterRef.name",
             "description": "SlurmCluster the nodes are lent to"},
            {"name": "Partition", "type": "string", "jsonPath": ".spec.partition",
             "description": "Partition the lent nodes join"},
            {"name": "Lent", "type": "integer", "jsonPath": ".status.counts.lent",
             "description": "Nodes lent and taking Slurm jobs"},
            {"name": "Selected", "type": "integer", "jsonPath": ".status.counts.selected", "priority": 1,
             "description": "GPU nodes the selector matches"},
            {"name": "Forecast", "type": "integer", "jsonPath": ".status.demand.forecastNodes", "priority": 1,
             "description": "Nodes Kubernetes is forecast to want within spec.forecast.headroomSeconds"},
            _ready_column("Whether the policy is valid and can lend"),
            {"name": "Reason", "type": "string", "priority": 1,
             "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
             "description": "Why the policy is (not) ready"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
    ),
)


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


def _structural(node: dict, defs: dict, path: str) -> dict:
    """Inline refs and rewrite one JSON-schema node into structural OpenAPI."""
    node = dict(node)
    node.pop("title", None)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **node}  # the field's own description/default win
        if "description" not in node and "description" in target:
            merged["description"] = target["description"]
        return _structural(merged, defs, path)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"{path}: unions other than Optional[X] cannot be structural")
        inner = _structural(options[0], defs, path)
        description = node.get("description", inner.get("description"))
        node = {**inner, **{k: v for k, v in node.items() if k != "default" or v is not None}}
        if description:
            node["description"] = description
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    if "default" in node:
        if node["default"] is None:
            del node["default"]
        else:
            node["default"] = _strip_none(node["default"])
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "patternProperties" in node:
        # A map with constrained keys (dict[LabelKey, X]). CRDs do not support
        # patternProperties, and an object schema without additionalProperties
        # would have its keys pruned: the values' schema becomes
        # additionalProperties, and the key check stays with the validators.
        patterns = node.pop("patternProperties")
        if len(patterns) != 1 or "additionalProperties" in node:
            raise SchemaError(f"{path}: a map needs exactly one key pattern")
        node["additionalProperties"] = next(iter(patterns.values()))
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], defs, path + "{}")
        if "description" not in node["additionalProperties"]:
            node["additionalProperties"]["description"] = f"One value of {path.rsplit('.', 1)[-1]}."
    node.pop("propertyNames", None)  # key patterns are checked by the validators
    if "properties" in node:
        node["properties"] = {
            k: _structural(v, defs, f"{path}.{k}") for k, v in node["properties"].items()
        }
    if "items" in node:
        node["items"] = _structural(node["items"], defs, path + "[]")
        if "description" not in node["items"]:
            node["items"]["description"] = f"One entry of {path.rsplit('.', 1)[-1]}."
    if node.get("type") == "array" and node.get("x-kubernetes-list-type") == "map":
        required = set(node["items"].get("required", []))
        missing = set(node["x-kubernetes-list-map-keys"]) - required
        if missing:
            raise SchemaError(f"{path}: list-map keys {sorted(missing)} must be required fields")
    if "type" not in node:
        raise SchemaError(f"{path}: schema node has no type")
    if "description" in node:
        node["description"] = " ".join(node["description"].split())
    # type and description first: the generated YAML reads like hand-written schema.
    head = {k: node[k] for k in ("type", "description") if k in node}
    return head | {k: v for k, v in node.items() if k not in head}


def openapi_schema(model: type[BaseModel]) -> dict:
    """The structural OpenAPI v3 schema of ``model``."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs, model.__name__)


def _schema_node(schema: dict, at: str) -> dict:
    """The node of ``schema`` at ``at`` ("", "spec", "spec.nodeSets[]" for each item)."""
    node = schema
    for part in filter(None, at.split(".")):
        name, items = (part[:-2], True) if part.endswith("[]") else (part, False)
        try:
            node = node["properties"][name]
            if items:
                node = node["items"]
        except KeyError:
            raise SchemaError(f"{at}: a CEL rule is placed on a field the schema does not have") from None
    return node


def _add_rules(schema: dict, kind: str) -> None:
    """The kind's CEL rules (:mod:`.celrules`) on their schema nodes, as ``x-kubernetes-validations``."""
    for rule in rules_for(kind):
        _schema_node(schema, rule.at).setdefault("x-kubernetes-validations", []).append(rule.entry())


def crd(spec: CrdSpec) -> dict:
    """The CustomResourceDefinition object for one kind."""
    spec_schema = openapi_schema(spec.spec_model)
    spec_schema["description"] = f"Desired state of the {spec.kind}."
    status_schema = openapi_schema(spec.status_model)
    status_schema["description"] = f"Observed state of the {spec.kind}, written by slurmk8s."
    schema = {
        "type": "object",
        "description": spec.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: "
                           f"{cluster.API_VERSION}."},
            "kind": {"type": "string", "description": f"Kind of this object: {spec.kind}."},
            "metadata": {"type": "object", "description": "Standard object metadata."},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    _add_rules(schema, spec.kind)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{spec.plural}.{cluster.GROUP}",
            "labels": {"app.kubernetes.io/name": "slurmk8s", "app.kubernetes.io/part-of": "slurmk8s"},
        },
        "spec": {
            "group": cluster.GROUP,
            "scope": spec.scope,
            "names": {
                "kind": spec.kind,
                "listKind": f"{spec.kind}List",
                "plural": spec.plural,
                "singular": spec.singular,
                "shortNames": list(spec.short_names),
                "categories": list(spec.categories),
            },
            "versions": [
                {
                    "name": cluster.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(spec.printer_columns),
                }
            ],
        },
    }


def all_crds() -> list[dict]:
    return [crd(s) for s in CRDS]


def crd_filename(obj: dict) -> str:
    """File name of a CRD under charts/slurmk8s/files/crds/."""
    return f"{obj['metadata']['name']}.yaml"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config files) as literal blocks, readable in the output;
    no YAML anchors, so a schema shared by two fields is written out twice."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value and not any(c in value for c in "\r\t") else None
    if style and any(line != line.rstrip() for line in value.split("\n")):
        style = None  # trailing spaces cannot be kept in a block scalar
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(objs: list[dict]) -> str:
    """A multi-document YAML stream, stable across runs (keys keep model order)."""
    return "".join(
        "---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                             width=100, allow_unicode=True)
        for o in objs
    )
