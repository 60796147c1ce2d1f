#!/bin/bash
#SBATCH --job-name=two-nodes
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=two-nodes-%j.out
# The usual torchrun-style bootstrap: the first node of the allocation is the master.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=29500
# shellcheck disable=SC2016 # each rank's own bash expands these
srun bash -c 'echo "rank=$SLURM_PROCID host=$(hostname) master=$MASTER_ADDR world=$SLURM_NTASKS ckpt=$SLURMK8S_CHECKPOINT_DIR"'
