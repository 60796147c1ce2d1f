"""The Kubernetes remote command protocol over WebSocket (``kubectl exec``). Pure.

A client opens a WebSocket with subprotocol ``v5.channel.k8s.io`` or
``v4.channel.k8s.io``; every message is one channel byte and the data:
0 stdin, 1 stdout, 2 stderr, 3 the command's end as a ``Status`` (JSON),
4 terminal resize (``{"Width": w, "Height": h}``). v5 adds 255, "close
channel N" (the one byte after it), which is how a client ends stdin.
kubectl 1.30+ and the Python client speak these; older kubectl speaks SPDY,
which is not served.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


class ProtocolError(ValueError):
    """A request or message the protocol does not allow; says what to send instead."""


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "")
    if value in ("", "0", "false", "False"):
        return False
    if value in ("1", "true", "True"):
        return True
    raise ProtocolError(f"{name} must be true or false, not {value!r}")


@dataclass(frozen=True)
class ExecOptions:
    command: tuple[str, ...]
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False
    tty: bool = False


def exec_options(query) -> ExecOptions:
    """The query of ``/exec/...`` (``command`` repeated, one word each) -> options.

    ``query`` is a multidict (``getall``) or a mapping of lists.
    """
    getall = query.getall if hasattr(query, "getall") else (lambda k, d=(): query.get(k, d))
    command = tuple(getall("command", ()))
    if not command:
        raise ProtocolError("command is required: give it after `--`, as in `kubectl exec POD -- sh -c 'echo hi'`")
    single = {k: (getall(k, ("",)) or ("",))[-1] for k in ("stdin", "stdout", "stderr", "tty")}
    opts = ExecOptions(command, *(_flag(single, k) for k in ("stdin", "stdout", "stderr", "tty")))
    if not (opts.stdin or opts.stdout or opts.stderr):
        raise ProtocolError("you must specify at least one of stdin, stdout, stderr")
    if opts.tty and opts.stderr:
        raise ProtocolError("stderr cannot be streamed apart from stdout with a tty: set stderr=false with tty=true")
    return opts


def chosen_protocol(offered: str) -> str | None:
    """The subprotocol to answer a ``Sec-WebSocket-Protocol`` header with (ours in our order)."""
    names = [p.strip() for p in offered.split(",") if p.strip()]
    return next((p for p in PROTOCOLS if p in names), None)


def frame(channel: int, data: bytes) -> bytes:
    return bytes([channel]) + data


def parse(message: bytes | str) -> tuple[int, bytes]:
    """One message from the client -> (channel, data). Text messages (the Python
    client sends its stdin as text) are read as UTF-8."""
    raw = message.encode() if isinstance(message, str) else message
    if not raw:
        raise ProtocolError("an empty message has no channel byte")
    return raw[0], raw[1:]


def resize(data: bytes) -> tuple[int, int]:
    """A resize message -> (columns, rows)."""
    try:
        size = json.loads(data)
        width, height = int(size["Width"]), int(size["Height"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f'a resize message is {{"Width": columns, "Height": rows}}, not {data[:80]!r}') from exc
    if not (0 <= width < 65536 and 0 <= height < 65536):
        raise ProtocolError(f"terminal size {width}x{height} is out of range")
    return width, height


def exit_status(code: int, command: tuple[str, ...] | list[str]) -> dict:
    """What channel 3 carries when the command ends: Success, or NonZeroExitCode
    with the code in the ``ExitCode`` cause, which kubectl exits with."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command {list(command)}, "
                       f"exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def error_status(message: str) -> dict:
    """Channel 3 for a command that could not run at all."""
    return {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500}
