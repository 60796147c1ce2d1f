#!/bin/bash
#SBATCH --job-name=devices
#SBATCH --partition=gpu
#SBATCH --gpus=4
#SBATCH --output=devices-%j.out
# Every GPU of the node: what Slurm gives the job, and the device files of
# its pod (the host's numbers, as the device plugin handed them over).
echo "host=$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES devices=$(cd /dev && echo nvidia[0-9]* | tr ' ' ,)"
