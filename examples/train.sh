#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --time=10
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=train-%j.out
# A data-parallel training job as researchers write them: one rank per node,
# the first node is the master, and the loop checkpoints on USR1 (sent before
# the time limit, or when the node is reclaimed), requeues itself and resumes
# from the checkpoint on its next start.
#
# Each checkpoint is published as a model version: it is written into a new
# directory (.new-*), renamed to step-NNNNNN, and only then is LATEST (one line:
# the version's directory name) replaced by a rename too. A reader such as the
# serving Deployment (examples/serving.yaml) that goes through LATEST never
# sees a half-written checkpoint. The three newest versions are kept.
#
#   sbatch train.sh               (TRAIN_STEPS=N sbatch train.sh for a longer run)
#
# SLURMK8S_CHECKPOINT_DIR comes from the cluster's TaskProlog; it is the same
# for every run of this job name, requeues included.
ckpt=${SLURMK8S_CHECKPOINT_DIR:-/shared/checkpoints/$USER/$SLURM_JOB_NAME}
mkdir -p "$ckpt"
step=0
latest=$(cat "$ckpt/LATEST" 2>/dev/null) && step=$(cat "$ckpt/$latest/step")
steps=${TRAIN_STEPS:-20}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=29500
echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST: step $step of $steps, master $MASTER_ADDR"
# shellcheck disable=SC2016 # each rank's own shell expands these
srun bash -c 'echo "rank $SLURM_PROCID of $SLURM_NTASKS on $(hostname): GPUs $CUDA_VISIBLE_DEVICES"'

save() {
  local version tmp versions
  version=$(printf 'step-%06d' "$step")
  if [ ! -d "$ckpt/$version" ]; then
    tmp=$(mktemp -d "$ckpt/.new-$version.XXXXXX") || return 1
    echo "$step" >"$tmp/step"
    printf '{"step": %d, "job": "%s"}\n' "$step" "$SLURM_JOB_ID" >"$tmp/model.json"  # the weights
    chmod 0755 "$tmp"  # readable by the serving pods
    mv -T "$tmp" "$ckpt/$version" || return 1
  fi
  # A plain file others may read: the Slurm agent reads it as nobody, never through a link.
  echo "$version" >"$ckpt/.LATEST.new" && chmod 0644 "$ckpt/.LATEST.new" && mv -f "$ckpt/.LATEST.new" "$ckpt/LATEST"
  versions=("$ckpt"/step-*)
  while [ ${#versions[@]} -gt 3 ]; do
    rm -rf "${versions[0]}"
    versions=("${versions[@]:1}")
  done
}
on_usr1() {
  save
  echo "USR1: checkpoint at step $step; requeueing"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
trap on_usr1 USR1

while [ "$step" -lt "$steps" ]; do
  step=$((step + 1))
  sleep 0.5 & wait $!   # one training step
  if [ $((step % 5)) -eq 0 ]; then
    save
    echo "step $step: checkpoint saved"
  fi
done
save
echo "done: $steps steps; model version $(cat "$ckpt/LATEST") in $ckpt"
