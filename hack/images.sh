#!/usr/bin/env bash
# Build the container images of images/ without Docker (buildah on a Debian
# base that mmdebstrap bootstraps), cached, and export each one for the
# sandbox's runtime. Arguments go to `slurmk8s images build`, e.g.
#   hack/images.sh                    # every image, for the default Slurm release
#   hack/images.sh slurmd login
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
exec .venv/bin/slurmk8s images build "$@"
