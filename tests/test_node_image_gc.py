"""The nodes' image store is collected as a kubelet collects its images: what no
container was made from for a day goes, and the least recently used others while the
disk is short of space, unless a mounted container root stands on one; blobs unused
for a day go too (a pull fetches them again)."""

import os
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import pulls
from sandbox.distribution import Pulled

DAY = 86400
PLENTY = 2**50  # bytes free: no shortage


def image(cache: Path, name: str, age: float) -> Path:
    path = cache / "images" / name
    (path / "rootfs" / "etc").mkdir(parents=True)
    (path / "rootfs" / "etc" / "os-release").write_text("x" * 1000)
    (path / "pull.json").write_text("{}")
    then = time.time() - age
    os.utime(path / "pull.json", (then, then))
    return path


@pytest.mark.root
def test_unused_images_and_old_blobs_go_and_a_mounted_or_recent_one_stays(tmp_path):
    assert os.geteuid() == 0, "the overlay mount needs root"
    cache = tmp_path / "cache"
    old, recent, mounted = image(cache, "a" * 64, 2 * DAY), image(cache, "b" * 64, 3600), image(cache, "c" * 64, 3 * DAY)
    blobs = cache / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / "old").write_bytes(b"b" * 500)
    os.utime(blobs / "old", (time.time() - 2 * DAY,) * 2)
    (blobs / "new").write_bytes(b"n")
    merged, upper, work = (tmp_path / d for d in ("merged", "upper", "work"))
    for d in (merged, upper, work):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={mounted / 'rootfs'},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        assert str(mounted / "rootfs") in pulls.mounted_lowers()
        removed, freed = pulls.prune(cache, free=lambda: PLENTY)
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    assert (removed, freed) == (1, 1000 + 2 + 500)  # os-release, pull.json, the old blob
    assert not old.exists() and recent.exists() and mounted.exists()
    assert sorted(p.name for p in blobs.iterdir()) == ["new"]


def test_a_container_made_from_an_image_marks_it_used(tmp_path):
    path = image(tmp_path, "d" * 64, 2 * DAY)
    pulls.NodeImages.used(Pulled("ghcr.io/slurmk8s/slurmd:26.05", "sha256:" + "d" * 64, path))
    assert time.time() - (path / "pull.json").stat().st_mtime < 60
    assert pulls.prune(tmp_path, free=lambda: PLENTY) == (0, 0)


def test_short_of_space_the_least_recently_used_images_go_until_enough_is_free(tmp_path):
    ages = {"a": 3600, "b": 7200, "c": 60, "d": 600}
    paths = {name: image(tmp_path, name * 64, age) for name, age in ages.items()}
    free = {"bytes": 10_000}

    def disk_free() -> int:  # each image removed frees what it held
        return free["bytes"] + sum(1002 for p in paths.values() if not p.exists())

    removed, freed = pulls.prune(tmp_path, min_free=12_000, free=disk_free)
    assert (removed, freed) == (2, 2 * 1002)
    assert sorted(n for n, p in paths.items() if p.exists()) == ["c", "d"]  # the two oldest went
    assert pulls.prune(tmp_path, min_free=12_000, free=disk_free) == (0, 0)
