#!/usr/bin/env bash
# The lending headline: the Philly training jobs and serving demand from the
# Azure LLM conversation trace on 64 nodes of 8 GPUs, half of them Slurm's own;
# the static split, the policies in examples/simulate/ and the oracle.
# Prints the table; writes docs/simulate/headline.json and the plots there.
#
#   hack/simulate_headline.sh [TRACES_DIR] [extra `slurmk8s simulate` options, e.g. --days 30]
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
if [ ! -d "$traces" ]; then
  echo "$(basename "$0"): no traces at $traces; give the folder that holds philly.csv and the Azure LLM traces as the first argument" >&2
  exit 2
fi
shift || true
out=docs/simulate
mkdir -p "$out"
exec .venv/bin/slurmk8s simulate \
  --nodes 64 --gpus-per-node 8 --slurm-nodes 32 \
  --jobs "$traces/philly.csv" --serving-requests "$traces/azure_llm_conv.csv" \
  --policy examples/simulate/idle-5m.yaml \
  --policy examples/simulate/idle-1h.yaml \
  --policy examples/simulate/idle-5m-grace0.yaml \
  --policy examples/simulate/idle-5m-max24-grace0.yaml \
  --compare --json "$out/headline.json" --plot "$out" "$@"
