"""Images through a registry: the sandbox's registry (Debian's docker-registry with TLS and
htpasswd, sandbox/registry.py), `slurmk8s images push` (buildah), and the distribution
client that pulls as containerd would (sandbox/distribution.py), and the kubelet's images
over it (sandbox/pulls.py: pull policies, mirrors, whose credentials).

Over 500 lines because its tests share one running registry and one image pushed to it,
which are the slow part; split, each module would start its own.

The unpacking tests build layer tars here and need nothing; the others (marked
``registry``) start a real registry and push a tiny image buildah commits from scratch
in two layers (a whiteout, a symlink), plus layers built by hand that a registry
accepts but the client must refuse (an entry climbing out, a blob altered in storage).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
from click.testing import CliRunner

from sandbox import registry as reg
from sandbox.distribution import DOCKER_MANIFEST, Puller, PullError, Reference, credentials_for
from sandbox.images import ImageError, push_ref
from sandbox.layers import LayerError, unpack_layer
from sandbox.pulls import DOCKERCONFIGJSON, NodeImages, NodeRegistries, default_policy, pull_secret_auths

# --- layers built here ------------------------------------------------------------------------


def _tar(entries) -> bytes:
    """A layer: (name, kind, extra) with kind file (extra: bytes), dir, sym/lnk (extra: target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, extra, *attrs in entries:
            info = tarfile.TarInfo(name)
            info.uid, info.gid, info.mode = 0, 0, 0o755 if kind == "dir" else 0o644
            for k, v in (attrs[0] if attrs else {}).items():
                setattr(info, k, v)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind in ("sym", "lnk"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = extra
                t.addfile(info)
            else:
                info.size = len(extra)
                t.addfile(info, io.BytesIO(extra))
    return buf.getvalue()


def _apply(tmp_path: Path, *layers: list) -> Path:
    root = tmp_path / "rootfs"
    root.mkdir(exist_ok=True)
    for i, entries in enumerate(layers):
        blob = tmp_path / f"layer{i}.tar"
        blob.write_bytes(_tar(entries))
        unpack_layer(blob, root, "")
    return root


def test_whiteouts_remove_what_lower_layers_made(tmp_path):
    root = _apply(tmp_path,
                  [("etc", "dir", None), ("etc/gone", "file", b"x"), ("etc/kept", "file", b"k"),
                   ("opt", "dir", None), ("opt/old", "file", b"o"), ("opt/sub", "dir", None)],
                  [("etc/.wh.gone", "file", b""), ("opt", "dir", None), ("opt/.wh..wh..opq", "file", b""),
                   ("opt/new", "file", b"n")])
    assert not (root / "etc/gone").exists() and not (root / "etc/.wh.gone").exists()
    assert (root / "etc/kept").read_bytes() == b"k"
    assert sorted(os.listdir(root / "opt")) == ["new"]


def test_an_opaque_marker_after_the_layers_own_files_spares_them(tmp_path):
    root = _apply(tmp_path, [("d", "dir", None), ("d/lower", "file", b"l")],
                  [("d", "dir", None), ("d/upper", "file", b"u"), ("d/.wh..wh..opq", "file", b"")])
    assert os.listdir(root / "d") == ["upper"]


@pytest.mark.root
def test_symlinks_are_kept_as_written_and_owners_and_setuid_kept(tmp_path):
    root = _apply(tmp_path, [("bin", "dir", None), ("bin/su", "file", b"su", {"mode": 0o4755, "uid": 7, "gid": 9}),
                             ("etc", "dir", None), ("etc/localtime", "sym", "/usr/share/zoneinfo/UTC")])
    assert os.readlink(root / "etc/localtime") == "/usr/share/zoneinfo/UTC"
    st = os.stat(root / "bin/su")
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o4755, 7, 9)


@pytest.mark.root
def test_extended_attributes_of_the_layer_are_restored(tmp_path):
    cap = bytes([1, 0, 0, 2, 0, 0x20, 0, 0] + [0] * 12)  # cap_net_raw+ep, as ping carries it
    root = _apply(tmp_path, [("ping", "file", b"x", {"pax_headers": {
        "SCHILY.xattr.user.mark": "kept", "SCHILY.xattr.security.capability": cap.decode("utf-8", "surrogateescape")}})])
    assert os.getxattr(root / "ping", "user.mark") == b"kept"
    assert os.getxattr(root / "ping", "security.capability") == cap


@pytest.mark.parametrize("name", ["../escaped", "a/../../escaped", "/etc/escaped"])
def test_an_entry_named_outside_the_root_is_refused(tmp_path, name):
    with pytest.raises(LayerError, match="absolute|'..'"):
        _apply(tmp_path, [(name, "file", b"evil")])
    assert not (tmp_path / "escaped").exists()


def test_a_path_through_a_symlink_stays_inside_the_root(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = _apply(tmp_path, [("up", "sym", "../../../.."), ("abs", "sym", str(outside)), ("tmp", "dir", None)],
                  [("up/evil", "file", b"1"), ("abs/evil", "file", b"2")])
    assert not (outside / "evil").exists() and not (tmp_path / "evil").exists()
    assert (root / "evil").read_bytes() == b"1"  # ../../.. from the root is the root, as in the container
    assert (root / str(outside).lstrip("/") / "evil").read_bytes() == b"2"


def test_a_file_replacing_a_symlink_does_not_write_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("host file")
    root = _apply(tmp_path, [("etc", "dir", None), ("etc/passwd", "sym", str(victim)), ("etc/d", "sym", str(tmp_path))],
                  [("etc/passwd", "file", b"image file"), ("etc/d", "dir", None, {"mode": 0o777})])
    assert victim.read_text() == "host file" and (tmp_path.stat().st_mode & 0o777) != 0o777
    assert (root / "etc/passwd").read_bytes() == b"image file" and not (root / "etc/d").is_symlink()


def test_a_hard_link_must_name_a_regular_file_of_the_image(tmp_path):
    (tmp_path / "secret").write_text("host")
    with pytest.raises(LayerError, match="hard link"):
        _apply(tmp_path, [("s", "sym", str(tmp_path / "secret")), ("h", "lnk", "s")])
    root = _apply(tmp_path, [("f", "file", b"data"), ("g", "lnk", "f")])
    assert os.stat(root / "g").st_ino == os.stat(root / "f").st_ino


def test_references_and_credentials():
    r = Reference.parse("127.0.0.1:5000/slurmk8s/slurmd:22.05")
    assert (r.registry, r.repository, r.tag, r.digest) == ("127.0.0.1:5000", "slurmk8s/slurmd", "22.05", None)
    d = "sha256:" + "a" * 64
    assert Reference.parse(f"reg.example:443/x@{d}").reference == d
    with pytest.raises(PullError) as e:
        Reference.parse("UPPER/case:tag")
    assert e.value.reason == "InvalidImageName"
    auth = base64.b64encode(b"u:p:w").decode()
    assert credentials_for({"auths": {"https://h:1": {"auth": auth}}}, "h:1") == ("u", "p:w")
    assert credentials_for({"h:1": {"username": "a", "password": "b"}}, "h:1") == ("a", "b")
    assert credentials_for({"auths": {"other:1": {"auth": auth}}}, "h:1") is None
    assert push_ref("ghcr.io/slurmk8s/slurmd:22.05", "127.0.0.1:5000/") == "127.0.0.1:5000/slurmd:22.05"
    assert push_ref("ghcr.io/slurmk8s/slurmd:22.05", "h.example/hpc") == "h.example/hpc/slurmd:22.05"
    for bad in ("noport", "https://h:1", "h:1/UPPER"):
        with pytest.raises(ImageError, match="--registry"):
            push_ref("ghcr.io/slurmk8s/slurmd:22.05", bad)


def test_an_unreachable_registry_is_named_in_the_error(tmp_path):
    port = reg._free_port("127.0.0.1")  # nothing listens there
    with pytest.raises(PullError) as e:
        Puller(tmp_path / "cache", connect_timeout=2).pull(f"127.0.0.1:{port}/x/y:1", None)
    assert e.value.reason == "ErrImagePull" and f"127.0.0.1:{port} unreachable" in e.value.message


# --- a real registry --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def registry():
    # Not under pytest's 0700 temporary directory: the registry runs as the docker-registry user.
    top = Path(tempfile.mkdtemp(prefix="slurmk8s-registry-test-"))
    top.chmod(0o755)
    r = reg.start(top / "registry")
    try:
        yield r
    finally:
        r.stop()
        shutil.rmtree(top, ignore_errors=True)


def _buildah(*args: str) -> str:
    return subprocess.run(["buildah", *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def tiny(registry, tmp_path_factory):
    """A two-layer image buildah commits from scratch: the upper layer deletes a file (a whiteout)
    and adds a symlink; pushed as <registry>/test/tiny:v1 with buildah. (ID, digest, auth file)."""
    work = tmp_path_factory.mktemp("tiny")
    (work / "files/etc").mkdir(parents=True)
    (work / "files/etc/motd").write_text("hello\n")
    (work / "files/etc/gone").write_text("deleted by the upper layer\n")
    images = []
    c = _buildah("from", "scratch")
    try:
        _buildah("copy", c, str(work / "files"), "/")
        _buildah("config", "--entrypoint", '["/bin/true"]', "--env", "A=1", c)
        images.append(_buildah("commit", "--quiet", "--format=docker", c))
    finally:
        _buildah("rm", c)
    c = _buildah("from", "--pull=never", images[0])
    try:
        mnt = Path(_buildah("mount", c))
        (mnt / "etc/gone").unlink()
        (mnt / "etc/link").symlink_to("/etc/motd")
        _buildah("umount", c)
        upper = _buildah("commit", "--quiet", "--format=docker", c)
        images.append(upper)
    finally:
        _buildah("rm", c)
    authfile = registry.write_authfile(work / "auth.json")
    digestfile = work / "digest"
    ca_dir = work / "certs"
    ca_dir.mkdir()
    shutil.copyfile(registry.ca_cert, ca_dir / "ca.crt")
    _buildah("push", "--quiet", f"--authfile={authfile}", f"--cert-dir={ca_dir}", f"--digestfile={digestfile}",
             upper, f"docker://{registry.address}/test/tiny:v1")
    try:
        yield upper, digestfile.read_text().strip(), authfile
    finally:
        for image in reversed(images):
            subprocess.run(["buildah", "rmi", image], capture_output=True)


@pytest.mark.registry
def test_pull_by_tag_then_by_digest_from_the_cache(registry, tiny, tmp_path):
    _, digest, _ = tiny
    puller = Puller(tmp_path / "cache", registry.ca_cert)
    first = puller.pull(f"{registry.address}/test/tiny:v1", registry.auths())
    assert first.digest == digest and len(first.fetched) == 3  # the config and two layers
    root = first.rootfs
    assert (root / "etc/motd").read_text() == "hello\n"
    assert not (root / "etc/gone").exists() and os.readlink(root / "etc/link") == "/etc/motd"
    assert first.oci_config["config"]["Entrypoint"] == ["/bin/true"] and "A=1" in first.oci_config["config"]["Env"]
    # The same image by digest, unpacked afresh: no blob fetched again.
    shutil.rmtree(first.path)
    second = puller.pull(f"{registry.address}/test/tiny@{digest}", registry.auths())
    assert second.fetched == () and (second.rootfs / "etc/motd").exists()


@pytest.mark.registry
def test_refused_credentials_missing_tags_and_no_credentials_carry_the_registrys_answer(registry, tiny, tmp_path):
    puller = Puller(tmp_path / "cache", registry.ca_cert)
    wrong = {"auths": {registry.address: {"username": registry.username, "password": "wrong"}}}
    with pytest.raises(PullError) as e:
        puller.pull(f"{registry.address}/test/tiny:v1", wrong)
    assert (e.value.reason, e.value.status) == ("ErrImagePull", 401)
    assert "401 Unauthorized: UNAUTHORIZED: authentication required" in e.value.message
    assert "wrong" not in str(e.value)
    with pytest.raises(PullError) as e:
        puller.pull(f"{registry.address}/test/tiny:v1", None)
    assert e.value.status == 401 and "no credentials" in e.value.message
    with pytest.raises(PullError) as e:
        puller.pull(f"{registry.address}/test/tiny:nope", registry.auths())
    assert e.value.status == 404 and "404 Not Found: MANIFEST_UNKNOWN: manifest unknown" in e.value.message
    with pytest.raises(PullError, match="certificate was refused"):
        Puller(tmp_path / "c2").pull(f"{registry.address}/test/tiny:v1", registry.auths())


def _push_by_hand(registry, repo: str, layer: bytes) -> str:
    """Push one gzipped layer and a config as a Docker schema 2 image, with the registry's own
    upload API; the manifest's digest."""
    s = requests.Session()
    s.auth, s.verify, s.trust_env = (registry.username, registry.password), str(registry.ca_cert), False
    base = f"https://{registry.address}/v2/{repo}"

    def blob(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = s.post(f"{base}/blobs/uploads/", timeout=10)
        assert start.status_code == 202, start.text
        loc = start.headers["Location"]
        done = s.put(loc + ("&" if "?" in loc else "?") + f"digest={digest}", data=data, timeout=10,
                     headers={"Content-Type": "application/octet-stream"})
        assert done.status_code == 201, done.text
        return {"digest": digest, "size": len(data)}

    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **blob(config)},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                            **blob(gzip.compress(layer))}]}
    body = json.dumps(manifest).encode()
    put = s.put(f"{base}/manifests/v1", data=body, headers={"Content-Type": DOCKER_MANIFEST}, timeout=10)
    assert put.status_code == 201, put.text
    return manifest["layers"][0]["digest"]


@pytest.mark.registry
def test_an_escaping_entry_and_an_altered_layer_are_refused(registry, tmp_path):
    _push_by_hand(registry, "test/escape", _tar([("../../etc/escaped", "file", b"evil")]))
    with pytest.raises(PullError, match=r"'\.\./\.\./etc/escaped' climbs out"):
        Puller(tmp_path / "cache", registry.ca_cert).pull(f"{registry.address}/test/escape:v1", registry.auths())
    # A layer altered in the registry's storage (same size, other bytes): its digest no longer matches.
    layer = _push_by_hand(registry, "test/altered", _tar([("f", "file", b"original")]))
    data = registry.storage / "docker/registry/v2/blobs/sha256" / layer[7:9] / layer[7:] / "data"
    content = bytearray(data.read_bytes())
    content[-1] ^= 0xFF
    data.write_bytes(bytes(content))
    with pytest.raises(PullError, match="does not match its descriptor") as e:
        Puller(tmp_path / "cache2", registry.ca_cert).pull(f"{registry.address}/test/altered:v1", registry.auths())
    assert layer in e.value.message
    # Nothing unverified kept: the next pull fetches the layer again.
    assert not (tmp_path / "cache2/blobs/sha256" / layer[7:]).exists() and not list((tmp_path / "cache2/tmp").iterdir())


def _cache_of(cache: Path, image_id: str) -> list[str]:
    """An image cache whose every image of the default release is buildah's ``image_id``; their tags."""
    from sandbox.images import DEFAULT_SLURM, recipes
    from sandbox.imagestore import ImageStore

    (cache / "refs").mkdir(parents=True)
    tags = [t for r in recipes([], DEFAULT_SLURM, ImageStore(cache).names()) for t in r.tags]
    for tag in tags:
        name = tag.rsplit("/", 1)[1].split(":")[0]
        (cache / "refs" / (quote(tag, safe="") + ".json")).write_text(json.dumps({"ref": tag, "name": name, "key": "k"}))
        (cache / name / "k").mkdir(parents=True, exist_ok=True)
        (cache / name / "k" / "image.json").write_text(json.dumps({"imageId": image_id, "tags": [tag]}))
    return tags


@pytest.mark.registry
def test_a_sandbox_pushes_no_image_the_shared_storage_holds_as_that_build(registry, tiny, tmp_path):
    """`sandbox up` pushes through a record of earlier pushes (publish.StorageRecord): an image
    the registry serves under its tag with the recorded digest, as the same build, is not
    pushed again; another build, or another digest, is."""
    from sandbox.images import DEFAULT_SLURM
    from sandbox.imagestore import ImageStore
    from sandbox.publish import StorageRecord

    image_id, digest, authfile = tiny
    cache = tmp_path / "cache"
    tags = _cache_of(cache, image_id)
    record = StorageRecord(registry, tmp_path / "pushed.json")
    said: list[str] = []

    def push() -> list[tuple[str, str]]:
        said.clear()
        return ImageStore(cache).push(f"{registry.address}/stored", [DEFAULT_SLURM], authfile=authfile,
                                      ca_file=registry.ca_cert, progress=said.append, record=record)

    first = push()
    assert len(first) == len(tags) and {d for _, d in first} == {digest}
    assert [m.split()[0] for m in said] == ["pushed"] * len(tags), said
    assert push() == first
    assert all(m.endswith("is there already") for m in said) and len(said) == len(tags), said
    data = json.loads(record.path.read_text())
    one, two = sorted(data)[:2]
    data[one]["image"] = "another build"
    data[two]["digest"] = "sha256:" + "0" * 64
    record.path.write_text(json.dumps(data))
    assert push() == first
    assert sorted(m.split()[1].split("@")[0].split("/", 1)[1] for m in said if m.startswith("pushed ")) == [one, two]


@pytest.mark.registry
def test_images_push_sends_every_image_of_a_release_and_no_layer_twice(registry, tiny, tmp_path):
    """`slurmk8s images push` over a cache whose every image of the release is the tiny image:
    each pushed and printed with its digest; pushed again, no blob is uploaded."""
    from sandbox.cli import images

    image_id, digest, authfile = tiny
    cache = tmp_path / "cache"
    tags = _cache_of(cache, image_id)
    argv = ["push", "--registry", f"{registry.address}/pushed", "--authfile", str(authfile),
            "--ca-file", str(registry.ca_cert), "--cache-dir", str(cache)]
    first = CliRunner().invoke(images, argv)
    assert first.exit_code == 0, first.output
    lines = first.stdout.split()
    assert sorted(lines) == sorted(f"{push_ref(t, registry.address + '/pushed')}@{digest}" for t in tags)
    uploads = reg.upload_count(registry.log)
    assert uploads >= 2  # the tiny image's layers, once (the other repositories mount them)
    again = CliRunner().invoke(images, argv)
    assert again.exit_code == 0 and sorted(again.stdout.split()) == sorted(lines)
    assert reg.upload_count(registry.log) == uploads
    # An image gone from the cache stops the push and is named, with the command that builds it.
    (cache / "refs" / (quote(tags[0], safe="") + ".json")).unlink()
    missing = CliRunner().invoke(images, argv)
    assert missing.exit_code == 1 and tags[0] in missing.output and "slurmk8s images build" in missing.output


@pytest.mark.registry
def test_collecting_a_registry_removes_the_image_a_push_untagged_and_keeps_the_tagged_one(tmp_path):
    top = Path(tempfile.mkdtemp(prefix="slurmk8s-registry-test-"))
    top.chmod(0o755)
    try:
        r = reg.start(top / "gc")
        try:
            old = _push_by_hand(r, "test/gc", _tar([("f", "file", b"first build")]))
            new = _push_by_hand(r, "test/gc", _tar([("f", "file", b"second build")]))  # the same tag
            blobs = r.storage / "docker/registry/v2/blobs/sha256"
            assert (blobs / old[7:9] / old[7:]).is_dir()
            assert "not collected: a registry serves it" in reg.collect(r.storage)
        finally:
            r.stop()
        assert "GiB freed" in reg.collect(r.storage)
        assert not (blobs / old[7:9] / old[7:]).exists() and (blobs / new[7:9] / new[7:]).is_dir()
        r = reg.start(top / "gc")
        try:
            pulled = Puller(tmp_path / "cache", r.ca_cert).pull(f"{r.address}/test/gc:v1", r.auths())
            assert (pulled.rootfs / "f").read_bytes() == b"second build"
        finally:
            r.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.registry
def test_the_registry_refuses_to_start_on_a_port_in_use_and_shows_its_log(registry, tmp_path):
    top = Path(tempfile.mkdtemp(prefix="slurmk8s-registry-test-"))
    top.chmod(0o755)
    try:
        with pytest.raises(reg.RegistryError, match="address already in use"):
            reg.start(top / "second", registry.address, timeout=10)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture
def token_service(tmp_path):
    """A Bearer token service as the registry's ``auth: token`` expects: HTTPS, Basic credentials,
    ES256 JWTs whose x5c certificate its CA signed. (address, CA directory, password); the
    requests it answered in ``.requests``."""
    import datetime
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    from sandbox.apiserver import tls

    pki_dir = Path(tempfile.mkdtemp(prefix="slurmk8s-token-test-"))
    pki_dir.chmod(0o755)
    pki = tls.ensure(pki_dir, ["127.0.0.1"], common_name="token-service", ca_name="token-ca")
    key = serialization.load_pem_private_key(pki.server_key.read_bytes(), None)
    leaf = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    password, answered = "token-secret", []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            query = parse_qs(urlparse(self.path).query)
            answered.append(query)
            if self.headers.get("Authorization") != "Basic " + base64.b64encode(f"u:{password}".encode()).decode():
                return self._send(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
            access = []
            for scope in query.get("scope", []):
                kind, name, actions = scope.split(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
            now = int(datetime.datetime.now(datetime.UTC).timestamp())
            header = {"alg": "ES256", "typ": "JWT",
                      "x5c": [base64.b64encode(leaf.public_bytes(serialization.Encoding.DER)).decode()]}
            claims = {"iss": "test-issuer", "sub": "u", "aud": query["service"][0], "exp": now + 300,
                      "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(), "access": access}
            signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
            r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
            self._send(200, {"token": f"{signing}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"})

        def _send(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.requests = answered
    server.ca = pki.ca_cert
    server.password = password
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(pki_dir, ignore_errors=True)


@pytest.mark.registry
def test_a_bearer_token_registry_is_pulled_from_with_a_token_for_the_repository(tiny, token_service, tmp_path):
    """The real registry with ``auth: token``: the client answers its Bearer challenge by asking the
    token service (with the pull secret's credentials) for the repository's pull scope."""
    image_id, _, _ = tiny
    top = Path(tempfile.mkdtemp(prefix="slurmk8s-registry-test-"))
    top.chmod(0o755)
    realm = f"https://127.0.0.1:{token_service.server_address[1]}/token"
    auth = {"token": {"realm": realm, "service": "sandbox-registry", "issuer": "test-issuer",
                      "rootcertbundle": str(token_service.ca)}}
    try:
        with reg.start(top / "registry", auth=auth) as r:
            secret = base64.b64encode(f"u:{token_service.password}".encode()).decode()
            creds = {"auths": {r.address: {"auth": secret}}}
            (top / "auth.json").write_text(json.dumps(creds))
            bundle = tmp_path / "bundle.crt"  # the registry's CA and the token service's
            bundle.write_text(r.ca_cert.read_text() + token_service.ca.read_text())
            # buildah's --cert-dir is for the registry's host only; the token service's CA comes from
            # the roots Go reads from SSL_CERT_FILE.
            push = subprocess.run(["buildah", "push", "--quiet", f"--authfile={top / 'auth.json'}", image_id,
                                   f"docker://{r.address}/test/tiny:v1"], capture_output=True, text=True,
                                  env={**os.environ, "SSL_CERT_FILE": str(bundle)})
            assert push.returncode == 0, push.stderr
            del token_service.requests[:]
            pulled = Puller(tmp_path / "cache", bundle).pull(f"{r.address}/test/tiny:v1", creds)
            assert (pulled.rootfs / "etc/motd").read_text() == "hello\n"
            assert token_service.requests == [{"service": ["sandbox-registry"], "scope": ["repository:test/tiny:pull"]}]
            wrong = {"auths": {r.address: {"username": "u", "password": "nope"}}}
            with pytest.raises(PullError) as e:
                Puller(tmp_path / "cache2", bundle).pull(f"{r.address}/test/tiny:v1", wrong)
            assert e.value.status == 401 and "UNAUTHORIZED: bad credentials" in e.value.message
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- the kubelet's images (sandbox/pulls.py) -------------------------------------------------

def _secret(auths: dict, type_: str = DOCKERCONFIGJSON) -> dict:
    doc = base64.b64encode(json.dumps({"auths": auths}).encode()).decode()
    return {"type": type_, "data": {".dockerconfigjson": doc}}


def test_pull_secrets_give_their_auths_the_first_naming_a_registry_winning_and_others_ignored():
    got = pull_secret_auths([_secret({"r:5000": {"auth": "Zmlyc3Q6MQ=="}}), _secret({"r:5000": {"auth": "x"}}),
                             _secret({"q": {"auth": "y"}}, "Opaque"), {"type": DOCKERCONFIGJSON, "data": {}},
                             {"type": DOCKERCONFIGJSON, "data": {".dockerconfigjson": "not base64!"}}])
    assert got == {"auths": {"r:5000": {"auth": "Zmlyc3Q6MQ=="}}}


@pytest.mark.parametrize("ref, policy", [("r:5000/a/b:1.0", "IfNotPresent"), ("r:5000/a/b", "Always"),
                                         ("r:5000/a/b:latest", "Always"), (f"r:5000/a/b@sha256:{'0' * 64}",
                                                                           "IfNotPresent")])
def test_the_default_pull_policy_is_kubernetes(ref, policy):
    assert default_policy(ref) == policy


def test_a_mirror_serves_the_references_under_its_prefix_only():
    nodes = NodeRegistries(mirrors={"ghcr.io/slurmk8s": "10.0.0.1:5000/slurmk8s"})
    assert nodes.resolve("ghcr.io/slurmk8s/slurmd:26.05") == ("10.0.0.1:5000/slurmk8s/slurmd:26.05", True)
    assert nodes.resolve("ghcr.io/slurmk8sx/slurmd:26.05") == ("ghcr.io/slurmk8sx/slurmd:26.05", False)
    assert nodes.resolve("docker.io/library/busybox:1") == ("docker.io/library/busybox:1", False)


@pytest.mark.registry
def test_pull_policies_mirrors_and_whose_credentials_a_pull_uses(registry, tiny, tmp_path):
    _, digest, _ = tiny
    mirrored = NodeImages(tmp_path / "node", NodeRegistries({"example.org/proj": f"{registry.address}/test"},
                                                            str(registry.ca_cert), registry.auths()["auths"]),
                          tmp_path / "refs")
    ref = "example.org/proj/tiny:v1"
    with pytest.raises(PullError) as e:
        mirrored.image(ref, "Never")
    assert e.value.reason == "ErrImageNeverPull" and ref in e.value.message
    # Through the mirror, with the node's credentials for it; the pod named none.
    image, asked = mirrored.image(ref, None)  # a tag: IfNotPresent
    assert asked and image.digest == digest and (image.rootfs / "etc/motd").exists()
    assert image.image_id == f"{registry.address}/test/tiny@{digest}" and image.config.entrypoint == ("/bin/true",)
    assert mirrored.image(ref, "IfNotPresent")[1] is False and mirrored.image(ref, "Never")[1] is False
    again, asked = mirrored.image(ref, "Always")  # asked again; nothing fetched
    assert asked and again.fetched == ()
    # Straight from the registry: the pod's secrets only, never the node's mirror credentials.
    direct = f"{registry.address}/test/tiny:v1"
    with pytest.raises(PullError) as e:
        mirrored.image(direct, "Always")
    assert e.value.status == 401
    wrong = pull_secret_auths([_secret({registry.address: {"username": registry.username, "password": "bad"}})])
    with pytest.raises(PullError) as e:
        mirrored.image(direct, "Always", wrong)
    assert e.value.status == 401 and "UNAUTHORIZED" in e.value.message
    right = pull_secret_auths([_secret(registry.auths()["auths"])])
    assert mirrored.image(direct, "Always", right)[0].digest == digest
    # Another cluster's nodes share the store by digest, not which digest a tag named.
    other = NodeImages(tmp_path / "node", mirrored.registries, tmp_path / "other-refs")
    with pytest.raises(PullError):
        other.image(ref, "Never")
    fresh, asked = other.image(ref, "IfNotPresent")
    assert asked and fresh.fetched == () and fresh.path == image.path
