#!/bin/bash
#SBATCH --job-name=gpus
#SBATCH --partition=gpu
#SBATCH --gpus=2
#SBATCH --output=gpus-%j.out
echo "host=$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
# Stay until the other GPU job has started too, so both hold GPUs at once.
touch "gpus-$SLURM_JOB_ID.started"
for _ in $(seq 60); do
  started=(gpus-*.started)
  [ "${#started[@]}" -ge 2 ] && break
  sleep 0.5
done
