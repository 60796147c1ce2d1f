#!/bin/bash
#SBATCH --job-name=long
#SBATCH --output=long-%j.out
echo started
# Slurm signals the job's processes one by one (proctrack/linuxproc): the
# shell may outlive its sleep by a moment, but the sleep never completes.
sleep 600 && echo "should never get here"
