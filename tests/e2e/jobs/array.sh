#!/bin/bash
#SBATCH --job-name=array
#SBATCH --array=0-3
#SBATCH --output=array-%A_%a.out
echo "task $SLURM_ARRAY_TASK_ID of array $SLURM_ARRAY_JOB_ID"
echo "checkpoints in $SLURMK8S_CHECKPOINT_DIR"
