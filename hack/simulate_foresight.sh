#!/usr/bin/env bash
# Lending with foresight (decision record 40) against today's best policy
# with serving p99 pending within 5 s (idle 5 min, grace 0), the static split
# and the oracle, on six serving demands over the Philly jobs, 64 nodes of 8
# GPUs:
#   conv        the headline: the Azure conversation hour stretched over the trace, 32 nodes Slurm's own
#   code        the Azure code hour stretched over the trace, 32 nodes Slurm's own
#   conv-48     the conversation hour, 48 of the 64 nodes Kubernetes'
#   conv-daily  the conversation hour repeated every hour times a profile of the
#               day (--serving-daily-cycle, an assumption: see `slurmk8s simulate --help`),
#               over the first DAYS_DAILY days (default 30)
#   m-small     ServeGen's m-small: 14 days of real request rates per 10 minutes
#               (--serving-rate), a clear daily cycle, bursts from day 9
#   m-mid       ServeGen's m-mid: 14 days, weaker cycles, load shifts and gaps
# The ServeGen scenarios run the first 14 days of the Philly jobs, 32 nodes Slurm's own.
# Writes docs/simulate/foresight-<scenario>.json and prints each table.
#
#   [PYTHON=python] hack/simulate_foresight.sh [TRACES_DIR] [SCENARIO ...]   (PYTHON: default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
if [ ! -d "$traces" ]; then
  echo "$(basename "$0"): no traces at $traces; give the folder that holds philly.csv, the Azure LLM traces and servegen/ as the first argument" >&2
  exit 2
fi
shift || true
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(conv code conv-48 conv-daily m-small m-mid)
out=docs/simulate
mkdir -p "$out"
for s in "${scenarios[@]}"; do
  case $s in
    conv) args=(--slurm-nodes 32 --serving-requests "$traces/azure_llm_conv.csv") ;;
    code) args=(--slurm-nodes 32 --serving-requests "$traces/azure_llm_code.csv") ;;
    conv-48) args=(--slurm-nodes 16 --serving-requests "$traces/azure_llm_conv.csv") ;;
    conv-daily) args=(--slurm-nodes 32 --serving-requests "$traces/azure_llm_conv.csv" --serving-daily-cycle
                      --days "${DAYS_DAILY:-30}") ;;
    m-small|m-mid) args=(--slurm-nodes 32 --serving-rate "$traces/servegen/$s.csv" --start "2017-09-25 00:00:00" --days 14) ;;
    *) echo "unknown scenario $s (conv, code, conv-48, conv-daily, m-small, m-mid)" >&2; exit 2 ;;
  esac
  echo "== $s"
  "${PYTHON:-.venv/bin/python}" -m slurmk8s.cli simulate --nodes 64 --gpus-per-node 8 --jobs "$traces/philly.csv" "${args[@]}" \
    --policy examples/simulate/idle-5m-grace0.yaml --policy examples/simulate/forecast-grace0.yaml \
    --compare --json "$out/foresight-$s.json"
done
