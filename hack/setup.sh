#!/usr/bin/env bash
# Install what slurmk8s needs on Debian bookworm, as root: Debian's Slurm,
# munge and OpenSSH (the same packages the images use), buildah, mmdebstrap
# and runc (the images, built and run without Docker), the distribution
# registry (docker-registry: images pushed and pulled), the tools the tests
# use (promtool, unpacked from Debian's prometheus package), and a virtual environment in .venv with slurmk8s installed editable,
# with the sandbox (sandbox/, its own distribution, which runs only from a
# checkout) and the tests' extras.
#
# Idempotent and quick when nothing is missing. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  say "run as root: the sandbox and the tests create Linux namespaces and start Slurm daemons"
  exit 1
fi
if ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  say "warning: this is not Debian bookworm; continuing, but only bookworm is tested"
fi

PACKAGES=(
  slurmctld slurmd slurm-client slurmrestd munge   # Slurm 22.05 from Debian
  slurm-wlm-jwt-plugin                             # auth/jwt: slurmctld with slurmrestd
  libpmix-dev                                      # srun --mpi=pmix: the plugin dlopens libpmix.so (the host keeps -dev)
  openssh-server openssh-client                    # login pods
  iproute2 util-linux procps                       # namespaces, veth, nsenter
  nftables kmod                                    # the sandbox enforces NetworkPolicies (sandbox/netpol.py; modprobe br_netfilter)
  buildah mmdebstrap runc                          # images without Docker (slurmk8s images build)
  docker-registry                                  # the sandbox's registry (CNCF distribution; sandbox/registry.py)
  shellcheck                                       # lints images/ and hack/
  python3 python3-venv python3-pip git
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The package enables a registry service on :5000 of every address; the sandbox starts its
# own, with TLS and a password (sandbox/registry.py), so Debian's stays off.
if [ -d /run/systemd/system ] && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  say "disabling Debian's docker-registry service (the sandbox runs its own registry)"
  systemctl disable --now --quiet docker-registry
fi

# promtool (the alert rules' unit tests) from Debian's prometheus package, unpacked
# into the cache, not installed: the package would start a Prometheus on :9090.
PROMTOOL_DIR=/var/cache/slurmk8s/prometheus
if [ ! -x "$PROMTOOL_DIR/usr/bin/promtool" ]; then
  say "unpacking promtool from Debian's prometheus package into $PROMTOOL_DIR"
  deb=$(mktemp -d)
  if ! (cd "$deb" && apt-get download prometheus >/dev/null 2>&1); then
    apt-get update -qq
    (cd "$deb" && apt-get download prometheus >/dev/null)
  fi
  mkdir -p "$PROMTOOL_DIR"
  dpkg-deb -x "$deb"/prometheus_*.deb "$PROMTOOL_DIR"
  rm -rf "$deb"
fi

# Debian's own Python (bookworm: 3.11.2), not whichever python3 comes first on
# PATH: the suite runs on what a fresh bookworm machine has, and the pure tier
# runs as an unprivileged user (hack/test.sh), who may not reach a Python
# installed under root's home.
PYTHON=${PYTHON:-/usr/bin/python3}
if [ -x .venv/bin/python ] \
    && [ "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" != "$(readlink -f "$(command -v "$PYTHON")")" ]; then
  say "recreating .venv: it was made with another Python than $PYTHON"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.slurmk8s-installed
want=$(cat pyproject.toml sandbox/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing slurmk8s and its test dependencies into .venv"
  log=.venv/pip-install.log
  if ! { .venv/bin/pip install --upgrade pip && .venv/bin/pip install -e '.[test]' -e ./sandbox; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    say "pip failed; the whole log is in $log"
    exit 1
  fi
  echo "$want" > "$stamp"
fi
say "ready: $(.venv/bin/slurmk8s --version)"
