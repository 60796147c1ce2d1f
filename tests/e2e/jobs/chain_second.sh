#!/bin/bash
#SBATCH --job-name=chain-second
#SBATCH --output=chain-second-%j.out
# Submitted with --dependency=afterok:<first>: it may only start once the first has succeeded.
test -f chain-first.done || { echo "first job has not finished" >&2; exit 1; }
date +%s.%N > chain-second.started
