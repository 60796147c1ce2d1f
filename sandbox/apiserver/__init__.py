"""A Kubernetes API server stand-in: the real REST protocol on aiohttp, so that
kopf, the kubernetes client and kubectl run against it unmodified.

``APIServer(data_dir).start()`` serves HTTPS on 127.0.0.1, authenticating
bearer tokens and authorizing with Kubernetes RBAC; ``write_kubeconfig()``
gives clients what they need (``identity="admin"`` or ``"kubelet"``). See
README.md in this folder for what is supported and what is not.
"""

from .server import APIServer, StartupError, load_crd_documents

__all__ = ["APIServer", "StartupError", "load_crd_documents"]
