"""``python -m sandbox.apiserver``: the stand-in as a foreground process.

Prints one line with its URL when it is ready (then logs to stderr), and stops
cleanly on SIGINT/SIGTERM. Killed and restarted on the same ``--data-dir``, it
keeps every object, its token and its CA, and continues the resourceVersion
sequence.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from slurmk8s import log as logconf

from .server import APIServer, StartupError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.apiserver", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, type=Path, help="where objects, the token and the certificates are kept")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--advertise-address", metavar="IP",
                   help="the address pods reach the server at: listened on too, put in the certificate, and "
                        "published as the endpoint of the `kubernetes` Service in `default`")
    p.add_argument("--port", default=0, type=int, help="port to listen on (default: any free port)")
    p.add_argument("--kubeconfig", type=Path, help="write an admin kubeconfig (system:masters) for this server here")
    p.add_argument("--kubelet-kubeconfig", type=Path,
                   help="write the kubelet's kubeconfig (user system:node:sandbox, group system:nodes) here")
    p.add_argument("--namespace", default="default", help="the kubeconfig's namespace (default: default)")
    p.add_argument("--crds", nargs="+", type=Path, default=[], metavar="DIR_OR_FILE",
                   help="CustomResourceDefinition YAML files or directories to create or update at start")
    p.add_argument("--tls-san", action="append", default=[], metavar="NAME_OR_IP",
                   help="extra name or IP the server certificate must cover (repeatable)")
    p.add_argument("--history", type=int, default=10000, help="watch events kept for resuming (default 10000)")
    p.add_argument("--log-level", default="info", choices=logconf.LEVELS)
    p.add_argument("--log-format", default="console", choices=("console", "json"))
    args = p.parse_args(argv)
    logconf.configure(args.log_level, args.log_format)
    srv = APIServer(args.data_dir, args.host, args.port, history_limit=args.history, tls_sans=args.tls_san, crds=args.crds,
                    advertise_address=args.advertise_address)
    try:
        srv.start()
    except StartupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.kubeconfig:
        srv.write_kubeconfig(args.kubeconfig, args.namespace)
    if args.kubelet_kubeconfig:
        srv.write_kubeconfig(args.kubelet_kubeconfig, args.namespace, identity="kubelet")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(srv.url, flush=True)
    while not stop.wait(0.5):
        if srv._thread is None or not srv._thread.is_alive():
            print("error: the Kubernetes stand-in stopped unexpectedly; see the log above", file=sys.stderr)
            return 1
    srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
