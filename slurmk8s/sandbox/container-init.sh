#!/usr/bin/env bash
# One container of a sandbox pod: build its root file system, switch into it,
# and exec the image's entrypoint.
#
# Usage: container-init.sh POD_DIR CONTAINER_DIR
#
# Started by pod-init.sh, in a mount namespace of its own (unshare --mount),
# inside the pod's network, UTS and PID namespaces; every mount here is the
# container's own. The root is an overlay: the host's root file system
# (Debian bookworm with the same Slurm, munge and OpenSSH packages the images
# install) as the read-only lower layer, and a private tmpfs as the writable
# layer, the way a container runtime stacks an image and a container layer.
# Nothing the container writes reaches the host, except through its volumes.
#   POD_DIR/gpus    how many emulated GPUs (/dev/nvidiaN character devices)
#   POD_DIR/volumes/<name>/   the files of ConfigMap, Secret and emptyDir volumes
#   CONTAINER_DIR holds what the sandbox prepared for this container:
#     image/        files the image adds (entrypoint, library, ...)
#     mounts        one volume a line: KIND<TAB>SOURCE<TAB>TARGET<TAB>ro|rw<TAB>MODE
#                   (KIND: bind or tmpfs; a relative SOURCE is inside POD_DIR)
#     env, argv     NUL-separated environment and entrypoint arguments
set -euo pipefail
pod=$1 ctr=$2

mapfile -d '' env < "$ctr/env"
mapfile -d '' argv < "$ctr/argv"
mapfile -t mounts < "$ctr/mounts"
gpus=$(cat "$pod/gpus")

# The root: host root (lower) + private writable layer (upper).
layer=$ctr/layer root=$ctr/root
mkdir -p "$layer" "$root"
mount -t tmpfs -o mode=0755 tmpfs "$layer"
mkdir "$layer/upper" "$layer/work"
mount -t overlay overlay -o "lowerdir=/,upperdir=$layer/upper,workdir=$layer/work" "$root"
cp -a "$ctr/image/." "$root/"

# Kernel file systems: a fresh /proc for the pod's PID namespace, the host's
# /sys (slurmd reads the cgroup tree there), private /run and /tmp.
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"

# A private /dev with the usual devices, a pty multiplexer for sshd, and the
# emulated GPUs: character devices with NVIDIA's major number, which Slurm's
# gres/gpu accepts and hands out as CUDA_VISIBLE_DEVICES.
dev=$root/dev
mount -t tmpfs -o mode=0755,nosuid tmpfs "$dev"
for spec in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r name major minor <<< "$spec"
  mknod -m 0666 "$dev/$name" c "$major" "$minor"
done
mkdir -p "$dev/pts" "$dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$dev/pts"
ln -s pts/ptmx "$dev/ptmx"
ln -s /proc/self/fd "$dev/fd"
ln -s /proc/self/fd/0 "$dev/stdin"
ln -s /proc/self/fd/1 "$dev/stdout"
ln -s /proc/self/fd/2 "$dev/stderr"
for ((i = 0; i < gpus; i++)); do
  mknod -m 0666 "$dev/nvidia$i" c 195 "$i"
done

# The container's volumes, in the order planned (parents before children).
# A target is resolved inside the container's root, symlinks on its way
# followed as the container sees them (/var/run -> /run), never into the
# host's file system, as container runtimes do.
for line in "${mounts[@]}"; do
  IFS=$'\t' read -r kind source target access mode <<< "$line"
  [ -n "$kind" ] || continue
  case $source in /*) ;; *) source=$pod/$source ;; esac
  target=$root$(chroot "$root" realpath -m -- "$target")
  case $kind in
    bind)
      if [ -d "$source" ]; then mkdir -p "$target"; else mkdir -p "$(dirname "$target")"; touch "$target"; fi
      mount --bind "$source" "$target"
      if [ "$access" = ro ]; then mount -o remount,bind,ro "$target"; fi
      ;;
    tmpfs)
      mkdir -p "$target"
      mount -t tmpfs -o "mode=${mode:-0755}" tmpfs "$target"
      ;;
    *) echo "pod-init: unknown mount kind $kind" >&2; exit 1 ;;
  esac
done

# Switch to the new root and let go of the host's.
cd "$root"
mkdir -p .host-root
pivot_root . .host-root
cd /
umount -l /.host-root
rmdir /.host-root
exec env -i "${env[@]}" "${argv[@]}"
