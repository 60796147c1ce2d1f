#!/bin/bash
#SBATCH --job-name=single
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --output=single-%j.out
echo "job $SLURM_JOB_ID on $(hostname) as $(id -un)"
echo "partition $SLURM_JOB_PARTITION"
