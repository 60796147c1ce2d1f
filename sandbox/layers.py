"""Unpack an image layer onto a root file system, as a container runtime does. Pure file work.

``unpack_layer(blob, root)`` applies one layer tar over the layers below it: OCI
whiteouts (``.wh.<name>``) remove what a lower layer made, an opaque marker
(``.wh..wh..opq``) empties a directory, every other entry replaces what was there.
It never writes outside ``root``: an entry named absolutely or with ``..`` is refused,
a path through a symlink is resolved inside the root as the container will see it
(never on the host), an existing entry is removed before a new one takes its place
(so no write follows a link the image made), and a hard link must name a file of the
root. Owners (numeric), modes (setuid included), device nodes and extended attributes
are kept, as a container's root file system needs them. Apart from the registry
client (:mod:`.distribution`) because it changes for its own reasons: what a layer
may do to the root.
"""

from __future__ import annotations

import copy
import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path

__all__ = ["LayerError", "unpack_layer", "WHITEOUT", "OPAQUE"]

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

class LayerError(ValueError):
    """A layer the sandbox refuses to unpack; the message names the entry."""


def unpack_layer(blob: Path, root: Path, compression: str = "gz") -> None:
    """Apply the layer tar ``blob`` onto ``root`` (the lower layers, already unpacked): its
    whiteouts remove what lower layers made, its entries replace what was there. Never
    writes outside ``root``, never follows a symlink to write (see the module's docstring)."""
    root = Path(root)
    made: set[str] = set()  # the paths (relative, resolved) this layer made: whiteouts spare them
    with tarfile.open(blob, f"r:{compression}" if compression else "r:") as tar:
        for member in tar:
            name = _entry_name(member.name)
            if name is None:  # the root itself
                continue
            parent_rel, base = _resolve_parent(root, name)
            rel = f"{parent_rel}/{base}" if parent_rel else base
            if base == OPAQUE:
                _clear_dir(root, parent_rel, made)
                continue
            if base.startswith(WHITEOUT):
                hidden = f"{parent_rel}/{base[len(WHITEOUT):]}" if parent_rel else base[len(WHITEOUT):]
                if hidden not in made and hidden.rsplit("/", 1)[-1] not in ("", ".", ".."):
                    _remove(root / hidden)
                continue
            target = root / rel
            existing = _lstat(target)
            if existing is not None and not (member.isdir() and stat.S_ISDIR(existing.st_mode)):
                _remove(target)
            if member.islnk():
                link = _entry_name(member.linkname)
                if link is None:
                    raise LayerError(f"hard link {member.name!r} -> {member.linkname!r} names the root")
                lp, lb = _resolve_parent(root, link)
                link_rel = f"{lp}/{lb}" if lp else lb
                st = _lstat(root / link_rel)
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise LayerError(f"hard link {member.name!r} -> {member.linkname!r}: the target is not a "
                                     "regular file of the image")
                member = _renamed(member, rel, link_rel)
            else:
                member = _renamed(member, rel)
            if member.isdev() or member.isfifo() or member.isfile() or member.isdir() or member.issym() \
                    or member.islnk():
                tar.extract(member, root, set_attrs=True, numeric_owner=True, **_TRUSTED)
                _set_xattrs(member, root / rel)
            made.add(rel)


#: Extract as written: this module does the checking. Python 3.12+ (and 3.11.4+)
#: filter entries and want that said; Debian bookworm's 3.11.2 has no filters.
_TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def _renamed(member: tarfile.TarInfo, name: str, linkname: str | None = None) -> tarfile.TarInfo:
    """A copy of ``member`` at ``name`` (and a hard link's ``linkname``); the
    entry itself is left as the archive read it (``TarInfo.replace`` is 3.11.4+)."""
    out = copy.copy(member)
    out.name = name
    if linkname is not None:
        out.linkname = linkname
    return out


def _entry_name(name: str) -> str | None:
    """The entry's path relative to the root: ``./`` and trailing slashes dropped; absolute
    names and ``..`` refused."""
    if name.startswith("/") or "\x00" in name:
        raise LayerError(f"entry {name!r} is an absolute path: an image's layer names its files from its root")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"entry {name!r} climbs out with '..': refused")
    return "/".join(parts) or None


def _resolve_parent(root: Path, name: str) -> tuple[str, str]:
    """(the parent directory of ``name`` resolved inside ``root``, the last component): every
    symlink on the way followed as the container will see it, with ``root`` as ``/``, so that
    nothing written there lands outside ``root``."""
    *parents, base = name.split("/")
    resolved: list[str] = []
    pending = list(parents)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        here = root.joinpath(*resolved, part)
        st = _lstat(here)
        if st is not None and stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                raise LayerError(f"entry {name!r}: too many symlinks on its path")
            target = os.readlink(here)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/")] + pending
            continue
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise LayerError(f"entry {name!r}: {'/'.join([*resolved, part])} is not a directory")
        resolved.append(part)
    return "/".join(resolved), base


def _clear_dir(root: Path, rel: str, made: set[str]) -> None:
    """An opaque whiteout: what lower layers put in ``rel`` goes; what this layer made stays."""
    directory = root / rel if rel else root
    st = _lstat(directory)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return
    for child in os.listdir(directory):
        child_rel = f"{rel}/{child}" if rel else child
        if child_rel not in made:
            _remove(directory / child)


def _remove(path: Path) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # rmtree does not follow symlinks inside it
    else:
        path.unlink()


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _set_xattrs(member: tarfile.TarInfo, path: Path) -> None:
    for key, value in (member.pax_headers or {}).items():
        if not key.startswith("SCHILY.xattr."):
            continue
        try:
            os.setxattr(path, key[len("SCHILY.xattr."):], value.encode("utf-8", "surrogateescape"),
                        follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EPERM):
                raise
