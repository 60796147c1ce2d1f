"""The login image's sshd setup (issue 13, item 9): StrictModes on, home
directories owned by their users, keys from Secrets checked as inline keys
are, and TCP forwarding as docs/decisions/0016 decides.

The shell functions run from images/common/slurmk8s-lib.sh, as the login
entrypoint sources them; the key rule is compared with the API's own
(`SshPublicKey`) on hostile lines and on random ones."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from slurmk8s.api.fields import SSH_KEY_TYPES, SshPublicKey

from .reach import reached, reaches

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "images/common/slurmk8s-lib.sh"
SSHD_CONFIG = ROOT / "images/login/sshd_config"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
_inline = TypeAdapter(SshPublicKey)


def inline_ok(line: str) -> bool:
    try:
        _inline.validate_python(line)
        return True
    except ValidationError:
        return False


def lib(script: str, stdin: bytes = b"", **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LIB}"; {script}'], input=stdin,
                          capture_output=True, env={**os.environ, **env}, timeout=30)


def valid_keys(lines: list[str]) -> tuple[list[str], str]:
    """The lines the lib's filter keeps, and what it logged."""
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
    proc = lib('sk_valid_keys "the Secret"', data)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode("utf-8", "surrogateescape").splitlines(), proc.stderr.decode(errors="replace")


def sshd_options() -> dict[str, str]:
    out = {}
    for line in SSHD_CONFIG.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            out.setdefault(key.lower(), value.strip())
    return out


# -- sshd_config --------------------------------------------------------------------------


def test_sshd_checks_the_modes_of_home_directories_and_keys():
    assert sshd_options()["strictmodes"] == "yes"


def test_tcp_forwarding_is_local_only_and_nothing_else_is_forwarded():
    """docs/decisions/0016: -L (and so editors' and notebooks' tunnels to a
    job's port) stays; remote forwards, gateways, tunnels, agent and X11
    forwarding do not."""
    opts = sshd_options()
    assert opts["allowtcpforwarding"] == "local"
    assert opts["gatewayports"] == "no"
    assert opts["permittunnel"] == "no"
    assert opts["allowagentforwarding"] == "no"
    assert opts["allowstreamlocalforwarding"] == "no"
    assert opts["x11forwarding"] == "no"


# -- keys from Secrets --------------------------------------------------------------------

HOSTILE = [
    f'command="/bin/sh -c id" {KEY}',
    f'from="10.0.0.0/8" {KEY}',
    f'environment="LD_PRELOAD=/tmp/x.so" {KEY}',
    f"no-pty,permitopen=\"*:*\" {KEY}",
    f"restrict,command=\"x\" {KEY}",
    f"{KEY}\r",
    f" {KEY}",
    f"\t{KEY}",
    f"{KEY} comment\u2028command=x",
    f"{KEY} comment\x00",
    "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
    "ssh-ed25519",
    "ssh-ed25519 ",
    f"{KEY} " + "x" * 17000,
    "cert-authority " + KEY,
]


@pytest.mark.parametrize("line", HOSTILE, ids=lambda s: repr(s)[:40])
def test_a_secret_line_with_options_or_junk_is_skipped_as_an_inline_one_is_refused(line):
    assert not inline_ok(line)
    kept, log = valid_keys([KEY, line])
    assert kept == [KEY]
    assert "line 2 of the Secret is not an OpenSSH public key" in log


def test_plain_keys_comments_and_blank_lines():
    lines = [KEY, f"{KEY} alice@laptop", "", "# a comment", f"{KEY} with  two spaces", *(
        f"{t} AAAAB3Nza= c" for t in SSH_KEY_TYPES)]
    kept, log = valid_keys(lines)
    assert kept == [line for line in lines if line and not line.startswith("#")]
    assert log == ""


_alphabet = st.sampled_from([*"aA09+/= ,\"#\t\r\x00\x1b~-_@.", "ssh-ed25519 ", "ssh-rsa ", "command=",
                             "\u2028", "\u0085", "é", "AAAAC3Nza", "ecdsa-sha2-nistp256 "])


#: Keys as the API takes them inline: '<type> <base64>[=...] [comment]'.
_keys = st.builds("{} {}{}{}".format, st.sampled_from(SSH_KEY_TYPES),
                  st.text("AZaz09+/", min_size=1, max_size=12), st.sampled_from(["", "=", "==", "==="]),
                  st.one_of(st.just(""), st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8)
                            .map(" {}".format)))


@st.composite
def _edited_keys(draw) -> str:
    """A key with one piece of the alphabet put in, or a character replaced or removed."""
    key = draw(_keys)
    at = draw(st.integers(0, len(key)))
    how = draw(st.sampled_from(["insert", "replace", "delete"]))
    piece = "" if how == "delete" else draw(_alphabet)
    return key[:at] + piece + key[at + (how != "insert"):]


@reaches(keeps=0.3, skips=0.45)
@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_keys, _edited_keys(), _edited_keys(), st.lists(_alphabet, max_size=12).map("".join)),
                min_size=1, max_size=40))
def test_the_secret_filter_keeps_exactly_the_lines_the_api_accepts_inline(lines):
    lines = [re.sub(r"[\n]", "", line) for line in lines]
    kept, _ = valid_keys(lines)
    want = [line for line in lines if inline_ok(line)]
    if want:
        reached("keeps")
    if len(want) < len(lines):
        reached("skips")
    assert kept == want


# -- home directories ---------------------------------------------------------------------

needs_root = pytest.mark.root  # chown to other users


@pytest.fixture
def tmp_path():
    """A directory every user may traverse, as /home is (pytest's own is root's only)."""
    d = Path(tempfile.mkdtemp(prefix="slurmk8s-home-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@needs_root
def test_a_home_directory_someone_else_owns_or_others_may_write_is_fixed(tmp_path):
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    os.chown(home, 12345, 12345)
    home.chmod(0o777)
    proc = lib(f'sk_fix_home alice 2001 2002 "{home}"')
    assert proc.returncode == 0, proc.stderr
    st_ = home.stat()
    assert (st_.st_uid, st_.st_gid) == (2001, 2002)
    assert st_.st_mode & 0o022 == 0
    assert b"alice" in proc.stderr


@needs_root
def test_a_home_directory_that_is_a_link_is_left_alone(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chown(target, 0, 0)
    target.chmod(0o777)
    home = tmp_path / "alice"
    home.symlink_to(target)
    proc = lib(f'sk_fix_home alice 2001 2001 "{home}"')
    assert proc.returncode == 0, proc.stderr
    assert (target.stat().st_uid, target.stat().st_mode & 0o777) == (0, 0o777)
    assert b"symbolic link" in proc.stderr


@needs_root
def test_a_home_directory_in_order_is_not_touched(tmp_path):
    home = tmp_path / "alice"
    home.mkdir()
    os.chown(home, 2001, 2001)
    home.chmod(0o750)
    proc = lib(f'sk_fix_home alice 2001 2001 "{home}"')
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    assert home.stat().st_mode & 0o777 == 0o750


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH's sshd is missing: run hack/setup.sh")
def test_sshd_accepts_the_config(tmp_path):
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(SSHD_CONFIG), "-o", f"HostKey={key}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


LIB = ROOT / "images/common/slurmk8s-lib.sh"


@pytest.mark.root
def test_a_user_dir_on_a_volume_users_write_is_made_without_following_a_link_made_meanwhile():
    """Issue 24: sk_user_dir (the login entrypoint's, and the directory users' at their first
    login) checks that PARENT/NAME is missing, then creates it
    and gives it to the user. A user who can write PARENT swaps in a link to a root-owned
    directory between the two (here: as the creating command, install or mkdir, starts).
    Root must not chown, or create anything in, what the link points to."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): the entrypoint's chown needs it")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        parent, target, shims = base / "shared", base / "root-only", base / "bin"
        for d in (parent, target, shims):
            d.mkdir()
        parent.chmod(0o1777)
        for tool in ("install", "mkdir"):  # the race, made certain: the user's link is there first
            (shims / tool).write_text(f"#!/bin/bash\nln -sfn {target} {parent}/alice\n"
                                      f"exec {shutil.which(tool)} \"$@\"\n")
            (shims / tool).chmod(0o755)
        script = (f'sk_log() {{ echo "$*"; }}\n'
                  f'eval "$(sed -n \'/^sk_user_dir() {{/,/^}}/p\' {LIB})"\n'
                  f'PATH={shims}:$PATH sk_user_dir {parent} alice 4242 4242\n')
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert "sk_user_dir" not in proc.stderr, proc.stderr  # the function was found and ran
        assert target.stat().st_uid == 0, "root chowned the link's target to the user"
        assert list(target.iterdir()) == []
        assert (parent / "alice").is_symlink()  # left as the user made it


def test_a_user_dir_someone_else_made_first_is_reported_not_used(tmp_path):
    squatted = tmp_path / "shared" / "alice"
    squatted.mkdir(parents=True)
    script = (f'sk_log() {{ echo "$*"; }}\n'
              f'eval "$(sed -n \'/^sk_user_dir() {{/,/^}}/p\' {LIB})"\n'
              f'sk_user_dir {tmp_path / "shared"} alice 4242 4242\n')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert "not alice's: left alone" in out and squatted.stat().st_uid == os.geteuid()


# -- shared volumes that do not let root give directories away ----------------------------

ENTRYPOINT = ROOT / "images/login/entrypoint.sh"
#: The uid an EFS access point does everything as (its PosixUser), whoever asks.
ACCESS_POINT_UID = 1000
DONE = "the entrypoint went on"


def _shared_dirs(base: Path, shims: dict[str, str], *, checkpoint: bool = False) -> subprocess.CompletedProcess:
    """The login entrypoint's prepare_shared_dirs, as it runs there (``set -euo
    pipefail``, the lib sourced), for users alice (4242) and bob (4243) on the
    volume ``base/shared``, with ``shims``: commands that behave as the volume
    does, first in PATH. A marker after it says the entrypoint went on."""
    users, bin_ = base / "users", base / "bin"
    users.mkdir()
    bin_.mkdir()
    (users / "passwd").write_text("alice:x:4242:4242::/home/alice:/bin/bash\nbob:x:4243:4243::/home/bob:/bin/bash\n")
    for tool, body in shims.items():
        (bin_ / tool).write_text("#!/bin/bash\n" + body)
        (bin_ / tool).chmod(0o755)
    env = f"SLURMK8S_SHARED_DIRS={base / 'shared'}"
    if checkpoint:
        env += f" SLURMK8S_CHECKPOINT_ROOT={base / 'shared' / 'checkpoints'}"
    script = (f'set -euo pipefail\n. "{LIB}"\nSK_USERS_DIR={users}\n'
              f'eval "$(sed -n \'/^prepare_shared_dirs() {{/,/^}}/p\' {ENTRYPOINT})"\n'
              f'PATH={bin_}:$PATH {env} prepare_shared_dirs\necho "{DONE}"\n')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def _volume(parent_mode: int) -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="slurmk8s-volume-")
    base = Path(tmp.name)
    base.chmod(0o755)
    (base / "shared").mkdir()
    (base / "shared").chmod(parent_mode)
    return tmp


#: Root-squashed NFS: root is nobody on the volume, so it creates nothing in a
#: directory only root may write and changes no owner; users are themselves.
ROOT_SQUASH = {
    "mkdir": f'[ "$(id -u)" != 0 ] && exec {shutil.which("mkdir")} "$@"\n'
             'echo "mkdir: cannot create directory: Permission denied" >&2; exit 1\n',
    "install": f'[ "$(id -u)" != 0 ] && exec {shutil.which("install")} "$@"\n'
               'echo "install: cannot create directory: Permission denied" >&2; exit 1\n',
    "chown": f'[ "$(id -u)" != 0 ] && exec {shutil.which("chown")} "$@"\n'
             'echo "chown: changing ownership: Operation not permitted" >&2; exit 1\n',
}


@pytest.mark.root
def test_on_an_efs_access_point_the_login_pod_starts_and_says_what_the_volume_must_allow():
    """Issue 43: an EFS access point refuses every chown and makes every file its own
    uid's. The entrypoint used to stop at the refused chown (set -e), so the login pod
    crash-looped. Now each user still gets a directory (everyone works there as the
    access point's uid), and the log says that and what the volume must allow."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): the entrypoint's chown needs it")
    with _volume(0o755) as tmp:
        base = Path(tmp)
        proc = _shared_dirs(base, {
            "chown": 'echo "chown: changing ownership of \'$3\': Operation not permitted" >&2; exit 1\n',
            # Whoever creates, the access point owns: setpriv's user switch changes nothing there.
            "mkdir": f'{shutil.which("mkdir")} "$@" && {shutil.which("chown")} {ACCESS_POINT_UID}:{ACCESS_POINT_UID} '
                     '"${@: -1}"\n',
            "setpriv": 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"\n',
        })
        assert proc.returncode == 0 and DONE in proc.stdout, proc.stderr
        for user in ("alice", "bob"):
            made = base / "shared" / user
            assert made.is_dir() and made.stat().st_uid == ACCESS_POINT_UID
            assert f"made it uid {ACCESS_POINT_UID}'s, not {user}'s" in proc.stderr
        assert "EFS access point" in proc.stderr
        assert "must let root change owners" in proc.stderr and "no_root_squash" in proc.stderr


@pytest.mark.root
def test_on_root_squashed_nfs_users_make_their_own_directories_where_they_may_write():
    """Issue 43: on root-squashed NFS root may neither create in a directory only users
    may write nor give one away; users used to get no directory. Where the volume lets
    users create entries (mode 1777, as /tmp), each user now makes their own, owned by them."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): setpriv needs it")
    with _volume(0o1777) as tmp:
        base = Path(tmp)
        proc = _shared_dirs(base, ROOT_SQUASH)
        assert proc.returncode == 0 and DONE in proc.stdout, proc.stderr
        for user, uid in (("alice", 4242), ("bob", 4243)):
            made = base / "shared" / user
            assert made.is_dir() and (made.stat().st_uid, made.stat().st_gid) == (uid, uid), proc.stderr
            assert f"created {made} for {user}, as {user}" in proc.stderr
        assert "warning" not in proc.stderr


@pytest.mark.root
def test_on_root_squashed_nfs_only_root_may_write_the_pod_starts_and_says_what_the_volume_must_allow():
    """Neither root (squashed) nor the users may create in the volume, nor its
    checkpoint directory: the entrypoint used to stop at the checkpoint directory
    (set -e). It goes on, and says what the volume must allow."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): setpriv needs it")
    with _volume(0o755) as tmp:
        base = Path(tmp)
        proc = _shared_dirs(base, ROOT_SQUASH, checkpoint=True)
        assert proc.returncode == 0 and DONE in proc.stdout, proc.stderr
        assert sorted(p.name for p in (base / "shared").iterdir()) == []
        assert f"could not create the checkpoint directory {base / 'shared' / 'checkpoints'}" in proc.stderr
        for user in ("alice", "bob"):
            assert f"could not create {base / 'shared' / user} for {user}" in proc.stderr
        assert "no_root_squash" in proc.stderr and "mode 1777" in proc.stderr
