#!/bin/bash
#SBATCH --job-name=chain-first
#SBATCH --output=chain-first-%j.out
sleep 2
date +%s.%N > chain-first.done
