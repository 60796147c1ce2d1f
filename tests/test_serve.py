"""slurmk8s/serve.py: follows LATEST of a model directory and serves what it names.

The last tests run the serve image's entrypoint on this host against a
directory that examples/train.sh publishes into (with the `fake_slurm` stand-ins of conftest),
as the serving pod would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurmk8s.published_model import LoadError, load, read_latest
from slurmk8s.serve import Follower, make_server

from .apiserver.conftest import wait_for
from .conftest import publish

ROOT = Path(__file__).resolve().parent.parent


def test_the_server_runs_as_a_file_with_only_the_layout_beside_it(tmp_path):
    """What the serve image holds (images/serve/Dockerfile): serve.py,
    published_model.py and httpserver.py, run by a bare python3 with nothing of
    slurmk8s installed; it answers, and logs through the standard library."""
    copied = tmp_path / "lib"
    copied.mkdir()
    dockerfile = (ROOT / "images/serve/Dockerfile").read_text()
    for name in ("serve.py", "published_model.py", "httpserver.py"):
        assert f"slurmk8s/{name}" in dockerfile and f"!slurmk8s/{name}" in (
            ROOT / "images/serve/Dockerfile.dockerignore").read_text()
        (copied / name).write_text((ROOT / "slurmk8s" / name).read_text())
    proc = subprocess.run(["python3", "-S", "-E", str(copied / "serve.py"), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=30)
    assert proc.returncode == 0 and "--model-dir" in proc.stdout, proc.stderr
    port = free_port()
    server = subprocess.Popen(["python3", "-S", "-E", str(copied / "serve.py"), "--model-dir", str(tmp_path),
                               "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        def answers():
            try:
                return get(f"http://127.0.0.1:{port}/nothing")
            except OSError:
                return None
        assert wait_for("the server", answers, timeout=15) == (404, {
            "error": "no such path /nothing; try / or /healthz", "kind": "not-found"})
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=10)
    assert server.returncode == 0, out
    assert "request method=GET path=/nothing status=404" in out


def test_read_latest_names_the_version(tmp_path):
    (tmp_path / "LATEST").write_text("step-000020\n")
    assert read_latest(tmp_path) == "step-000020"


@pytest.mark.parametrize("content, why", [
    (None, "does not exist yet"),
    ("", "does not hold a version directory name"),
    ("../../etc", "does not hold a version directory name"),
    ("a/b", "does not hold a version directory name"),
    (".hidden", "does not hold a version directory name"),
    ("x" * 200, "does not hold a version directory name"),
])
def test_read_latest_refuses_what_is_not_a_version(tmp_path, content, why):
    if content is not None:
        (tmp_path / "LATEST").write_text(content)
    with pytest.raises(LoadError, match=why):
        read_latest(tmp_path)


def test_load_reads_the_step_and_lists_the_files(tmp_path):
    path = publish(tmp_path, "step-000020", 20)
    (path / ".partial").write_text("")
    model = load(tmp_path, "step-000020", now=5.0)
    assert model.as_json() == {"version": "step-000020", "step": 20, "path": str(path),
                               "files": ["model.json", "step"], "loadedAt": 5.0}
    publish(tmp_path, "final")
    assert load(tmp_path, "final").step is None  # a version without a step file


def test_load_refuses_a_missing_version_a_bad_step_and_a_symlink_out(tmp_path):
    with pytest.raises(LoadError, match="cannot read version 'gone'"):
        load(tmp_path, "gone")
    (publish(tmp_path, "bad") / "step").write_text("twelve")
    with pytest.raises(LoadError, match="does not hold a step number"):
        load(tmp_path, "bad")
    (tmp_path / "out").symlink_to("/etc")
    with pytest.raises(LoadError, match="symbolic link"):
        load(tmp_path, "out")


def test_the_follower_loads_new_versions_and_keeps_the_last_good_one(tmp_path):
    follower = Follower(tmp_path)
    assert not follower.refresh() and follower.model is None
    assert "does not exist yet" in follower.error
    publish(tmp_path, "step-000005", 5)
    assert follower.refresh() and follower.model.step == 5
    assert not follower.refresh()  # LATEST unchanged: nothing is reloaded
    publish(tmp_path, "step-000010", 10)
    assert follower.refresh() and follower.model.version == "step-000010"
    (tmp_path / "LATEST").write_text("missing\n")
    assert not follower.refresh()
    assert follower.model.version == "step-000010" and "missing" in follower.error


SECRET = "s3cr3t-token-of-someone-else-0123456789"


@pytest.fixture
def secret_file(tmp_path) -> Path:
    """A file only its owner may read, outside the model directory."""
    path = tmp_path / "private" / "token"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def _follow_once(model_dir: Path) -> tuple[Follower, tuple[int, dict]]:
    server, follower = make_server(model_dir, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        follower.refresh()
        return follower, get(f"http://127.0.0.1:{server.server_port}/healthz")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("how", ["latest-link", "latest-link-to-version-name", "version-dir-link",
                                 "step-link", "latest-garbage", "step-garbage"])
def test_nothing_is_read_through_a_link_nor_echoed(tmp_path, secret_file, caplog, how):
    """Issue 24, item 5: LATEST (or the version directory, or its step file) as a link out
    of the model directory is not followed, and what a file holds is never in a response
    nor in the log, whatever it holds."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    if how == "latest-link":
        (model_dir / "LATEST").symlink_to(secret_file)
    elif how == "latest-link-to-version-name":  # a file that would be a fine LATEST, read through a link
        (tmp_path / "elsewhere").write_text("step-000001\n")
        publish(model_dir, "step-000001", 1)
        (model_dir / "LATEST").unlink()
        (model_dir / "LATEST").symlink_to(tmp_path / "elsewhere")
    elif how == "version-dir-link":
        (model_dir / "LATEST").write_text("v1\n")
        (model_dir / "v1").symlink_to(secret_file.parent)
    elif how == "step-link":
        (publish(model_dir, "v1", 1) / "step").unlink()
        (model_dir / "v1" / "step").symlink_to(secret_file)
    elif how == "latest-garbage":
        (model_dir / "LATEST").write_text(SECRET + " is not a version\n")
    elif how == "step-garbage":
        (publish(model_dir, "v1", 1) / "step").write_text(SECRET + "\n")
    caplog.set_level("DEBUG", logger="slurmk8s.serve")
    follower, (code, body) = _follow_once(model_dir)
    assert follower.model is None and code == 503
    assert body == {"error": "no model loaded", "kind": "no-model"}
    assert SECRET[:6] not in json.dumps(body) and SECRET[:6] not in caplog.text
    assert SECRET[:6] not in follower.error
    if "link" in how:
        assert "symbolic link" in follower.error


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_http_answers_503_until_a_model_is_loaded_then_the_model(tmp_path):
    server, follower = make_server(tmp_path, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        follower.refresh()
        code, body = get(f"{url}/healthz")
        assert (code, body) == (503, {"error": "no model loaded", "kind": "no-model"})  # why: in the log only
        assert "does not exist yet" in follower.error
        assert get(f"{url}/")[0] == 503
        publish(tmp_path, "step-000005", 5)
        follower.refresh()
        assert get(f"{url}/healthz") == (200, {"status": "ok", "version": "step-000005"})
        code, body = get(f"{url}/")
        assert code == 200 and body["version"] == "step-000005" and body["step"] == 5
        assert body["path"] == str(tmp_path / "step-000005")
        assert get(f"{url}/other")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_image_follows_what_train_sh_publishes(tmp_path, fake_slurm):
    """The image's entrypoint serves each version examples/train.sh publishes."""
    model_dir = tmp_path / "checkpoints/researcher/train"
    for _ in range(3):  # a port found free may be taken before the server binds it (other tests run at once)
        port = free_port()
        env = {"PATH": os.environ["PATH"], "SLURMK8S_MODEL_DIR": str(model_dir), "SLURMK8S_SERVE_PORT": str(port)}
        server = subprocess.Popen(["bash", str(ROOT / "images/serve/entrypoint.sh")], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"

        def answers():
            try:
                return get(f"{url}/healthz")  # noqa: B023 - called within this iteration
            except OSError:
                return "exited" if server.poll() is not None else None  # noqa: B023 - as above
        first = wait_for("the server", answers, timeout=30)
        if first != "exited":
            break
    assert first != "exited", server.communicate()[0]
    try:
        assert first[0] == 503  # up, but nothing published yet
        job = {**fake_slurm, "SLURMK8S_CHECKPOINT_DIR": str(model_dir), "TRAIN_STEPS": "6"}
        train = subprocess.run(["bash", str(ROOT / "examples/train.sh")], env=job, capture_output=True,
                               text=True, timeout=60)
        assert train.returncode == 0, train.stderr
        assert "done: 6 steps; model version step-000006" in train.stdout
        body = wait_for("step 6 served", lambda: (r := get(f"{url}/")) and r[0] == 200 and r[1]["step"] == 6 and r[1],
                        timeout=15)
        assert body["version"] == "step-000006" and body["path"] == str(model_dir / "step-000006")
        assert sorted(p.name for p in model_dir.iterdir()) == ["LATEST", "step-000005", "step-000006"]
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=10)
    assert server.returncode == 0, out
    assert "loaded model version step-000006" in out
