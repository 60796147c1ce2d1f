"""A researcher at a terminal: SSH and SFTP to the login pod, plain Slurm commands."""

from __future__ import annotations

import re
import shlex
import time

import paramiko


class Researcher:
    def __init__(self, host: str, port: int, user: str, identity: str, known_hosts: str):
        self.user = user
        self.ssh = paramiko.SSHClient()
        self.ssh.load_host_keys(known_hosts)
        self.ssh.set_missing_host_key_policy(paramiko.RejectPolicy())  # the host key must match
        self.ssh.connect(host, port=port, username=user, key_filename=identity,
                         look_for_keys=False, allow_agent=False, timeout=15)
        self.sftp = self.ssh.open_sftp()

    def close(self) -> None:
        self.sftp.close()
        self.ssh.close()

    def run(self, command: str, timeout: float = 60) -> tuple[int, str, str]:
        _, stdout, stderr = self.ssh.exec_command(command, timeout=timeout)
        out, err = stdout.read().decode(), stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err

    def check(self, command: str) -> str:
        rc, out, err = self.run(command)
        assert rc == 0, f"`{command}` failed ({rc}): {err}"
        return out

    def put(self, text: str, remote: str, mode: int = 0o755) -> None:
        with self.sftp.open(remote, "w") as f:
            f.write(text)
        self.sftp.chmod(remote, mode)

    def read(self, remote: str) -> str:
        with self.sftp.open(remote) as f:
            return f.read().decode()

    def exists(self, remote: str) -> bool:
        try:
            self.sftp.stat(remote)
            return True
        except FileNotFoundError:
            return False

    def sbatch(self, script: str, *args: str, cwd: str) -> int:
        out = self.check(f"cd {shlex.quote(cwd)} && sbatch --parsable {shlex.join(args)} {shlex.quote(script)}")
        return int(out.strip().split(";")[0])

    def job(self, job_id: int | str) -> dict[str, str]:
        """`scontrol show job` fields (Slurm keeps finished jobs for MinJobAge, 300 s)."""
        out = self.check(f"scontrol show job --oneliner {job_id}")
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait_state(self, job_id: int | str, states: set[str], timeout: float = 120) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info["JobState"] in states:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {info['JobState']} ({info.get('Reason')}), "
                                     f"not {states}, after {timeout}s")
            time.sleep(0.5)

    def wait_file(self, remote: str, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exists(remote):
                text = self.read(remote)
                if re.search(pattern, text):
                    return text
            time.sleep(0.5)
        raise AssertionError(f"{remote} did not show {pattern!r} within {timeout}s")
