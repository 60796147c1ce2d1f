#!/bin/bash
# gpu-facts.sh: what a pod (or host) given GPUs sees, as the NVIDIA device
# plugin and container toolkit set it up: the device nodes with their
# numbers, NVIDIA_VISIBLE_DEVICES, the driver's view of each GPU. Run it in
# a pod with a nvidia.com/gpu limit (`kubectl exec POD -- bash -s <
# hack/gpu-facts.sh`) when a slurmd pod says its GPU devices do not match
# its count; sandbox/gpus.py follows what it printed on a real H100 pod.
set -u
echo "== environment"
env | grep -E '^(NVIDIA|CUDA)_VISIBLE_DEVICES=' | sort
echo "== device nodes (major, minor)"
for f in /dev/nvidia* /dev/nvidia-caps/*; do
  [ -c "$f" ] && stat -c '%n %t %T' "$f" | awk '{printf "%s %d:%d\n", $1, strtonum("0x" $2), strtonum("0x" $3)}'
done
echo "== /proc/devices"
grep -i nvidia /proc/devices
echo "== the driver's GPUs"
for d in /proc/driver/nvidia/gpus/*; do
  [ -r "$d/information" ] && grep -E 'Model|Bus Location|Device Minor|GPU UUID' "$d/information"
done
if command -v nvidia-smi >/dev/null; then
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv
fi
