"""slurmrestd: a Deployment and its Service, with the plugins of the
cluster's Slurm release. Pure.
"""

from __future__ import annotations

from .. import versions
from ..api.cluster import RESTAPI_RESOURCES
from . import names
from .pods import DAEMON_POD_SECURITY, Builder, base_volumes, common_env, pod_template, resources_of, slurm_container

__all__ = ["objects"]


def objects(b: Builder) -> list[dict]:
    c = b.c
    name = names.restapi(c)
    sel = names.selector(c, "restapi")
    volumes, mounts = base_volumes(c, config=True)
    release = versions.release(c.spec.slurm.version)
    env = {**common_env(c), "SLURMK8S_RESTD_OPENAPI": release.rest_openapi_plugin}
    if release.rest_data_parser:
        env["SLURMK8S_RESTD_DATA_PARSER"] = release.rest_data_parser
    container = slurm_container(
        c, "slurmrestd", "slurmrestd", env=env, mounts=mounts,
        ports=[{"name": "http", "containerPort": names.SLURMRESTD_PORT}],
        resources=resources_of(c.spec.rest_api.resources, RESTAPI_RESOURCES),
        readinessProbe={"tcpSocket": {"port": "http"}, "periodSeconds": 10},
        # slurmrestd refuses to run as root or as SlurmUser.
        securityContext={"runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": True},
    )
    return [
        b.obj("v1", "Service", b.meta(name, "restapi"), spec={
            "selector": sel,
            "ports": [{"name": "http", "port": names.SLURMRESTD_PORT, "targetPort": "http"}],
        }),
        b.obj("apps/v1", "Deployment", b.meta(name, "restapi"), spec={
            "replicas": c.spec.rest_api.replicas,
            "selector": {"matchLabels": sel},
            "template": pod_template(c, sel, names.labels(c, "restapi"), [container], volumes,
                                     securityContext=dict(DAEMON_POD_SECURITY)),
        }),
    ]
