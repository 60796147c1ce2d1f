"""Waiting before trying again (slurmk8s/backoff.py) and the clients that do
(issue 41, item 9): ``Retry-After`` read and bounded; the Kubernetes client
asks a busy API server again after what it asks for, within its timeout, and
a server that stays busy or does not answer is an ``ApiError``; the rounds'
backoff grows, jitters and is capped."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from slurmk8s.backoff import RETRY_AFTER_CAP, busy, retry_after, round_backoff
from slurmk8s.kube import ApiError, Kube


@pytest.mark.parametrize("header, seconds", [("3", 3.0), ("0", 0.0), (None, 1.0), ("", 1.0), ("soon", 1.0),
                                             ("-5", 1.0), ("1.5", 1.0), ("99999999", RETRY_AFTER_CAP),
                                             ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)])
def test_retry_after_is_read_strictly_and_bounded(header, seconds):
    assert retry_after(header) == seconds


def test_an_http_date_is_the_time_until_it():
    now = 1_800_000_000.0
    assert retry_after(email.utils.formatdate(now + 4, usegmt=True), now=lambda: now) == 4.0


def test_any_header_gives_a_wait_within_the_cap():
    seen: Counter = Counter()
    headers = st.one_of(st.text(max_size=40), st.integers(0, 10**12).map(str),
                        st.floats(0, 4e9).map(lambda t: email.utils.formatdate(t, usegmt=True)))

    @settings(max_examples=300)
    @given(headers)
    def check(header):
        parsed = retry_after(header, default=1e11, cap=1e12) != 1e11
        seen["parses" if parsed else "default"] += 1
        event("parses" if parsed else "default")
        assert 0.0 <= retry_after(header) <= RETRY_AFTER_CAP

    check()
    assert seen["parses"] >= 50 and seen["default"] >= 50, seen


def test_busy_is_429_or_a_5xx_that_says_when():
    assert busy(429, None) and busy(503, "1") and not busy(503, None) and not busy(409, "1")


def test_the_rounds_backoff_doubles_with_jitter_up_to_its_cap():
    seen: Counter = Counter()

    @settings(max_examples=200)
    @given(st.integers(1, 16), st.sampled_from([1.0, 2.0, 10.0]))
    def check(failures, interval):
        wait = round_backoff(failures, interval, cap=300.0)
        base = interval * 2 ** (failures - 1)
        seen["capped" if base >= 300.0 else "growing"] += 1
        event("capped" if base >= 300.0 else "growing")
        assert min(base, 300.0) <= wait <= min(base + interval, 300.0)
        assert round_backoff(0, interval) == interval  # no failure: the interval

    check()
    assert seen["capped"] >= 15 and seen["growing"] >= 15, seen


class Apf(BaseHTTPRequestHandler):
    """An API server under API Priority and Fairness: 429 with Retry-After ``busy_for`` times."""

    busy_for = 2
    asked: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        Apf.asked.append(time.monotonic())
        if len(Apf.asked) <= self.busy_for:
            code, body, extra = 429, {"kind": "Status", "reason": "TooManyRequests", "message": "too many"}, \
                {"Retry-After": "1"}
        else:
            code, body, extra = 200, {"kind": "ConfigMap", "metadata": {"name": "x"}}, {}
        data = json.dumps(body).encode()
        self.send_response(code)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **extra}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def apf():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Apf)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def kube_at(url: str, timeout: float) -> Kube:
    from kubernetes import client
    cfg = client.Configuration()
    cfg.host = url
    return Kube(cfg, timeout=timeout)


def test_the_kubernetes_client_asks_a_busy_server_again_after_its_retry_after(apf):
    Apf.asked, Apf.busy_for = [], 2
    assert kube_at(apf, 10).get("ConfigMap", "ns", "x")["metadata"]["name"] == "x"
    gaps = [b - a for a, b in pairwise(Apf.asked)]
    assert len(Apf.asked) == 3 and all(g >= 0.9 for g in gaps), gaps


def test_a_server_busy_for_ever_is_an_api_error_within_the_timeout(apf):
    Apf.asked, Apf.busy_for = [], 10**6
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        kube_at(apf, 3).get("ConfigMap", "ns", "x")
    assert caught.value.status == 429 and time.monotonic() - started < 3 + 0.5
    assert 1 < len(Apf.asked) <= 4


def test_no_answer_is_an_api_error_too():
    with pytest.raises(ApiError) as caught:
        kube_at("http://127.0.0.1:9", 2).get("ConfigMap", "ns", "x")
    assert caught.value.unreachable
