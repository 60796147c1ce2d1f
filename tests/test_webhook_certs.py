"""The webhook's certificate as the serving process keeps it
(slurmk8s/operator/certs.py; decision record 53): what is due when, and
that over years of renewals the API server never meets a serving
certificate its caBundle cannot verify."""

from __future__ import annotations

import base64
import datetime as dt
import ssl

from cryptography import x509
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from slurmk8s.operator import certs

NAMES = certs.service_names("ops-slurmk8s-webhook", "slurmk8s-system")
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def issue(stored: certs.Stored, now: dt.datetime, bundle=()) -> tuple[certs.Plan, certs.Stored]:
    p = certs.plan(stored, NAMES, now, bundle)
    return p, (certs.read(certs.renew(stored, p, NAMES, now, "test CA")) if p.writes else stored)


def verifies(bundle, stored: certs.Stored, now: dt.datetime) -> bool:
    """Whether a client trusting ``bundle`` accepts the served certificate for the Service's name at ``now``."""
    leaf = stored.leaf
    if leaf is None or not (leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc):
        return False
    for ca in bundle:
        if ca.not_valid_before_utc <= now < ca.not_valid_after_utc:
            try:
                leaf.verify_directly_issued_by(ca)
            except Exception:  # noqa: BLE001 - any failure is "not this one"
                continue
            names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            return NAMES[0] in names.get_values_for_type(x509.DNSName)
    return False


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate_for_the_services_names_at_once():
    p, s = issue(certs.read({}), T0)
    assert p == certs.Plan(new_ca=True, new_leaf=True)
    assert s.ca is not None and s.leaf is not None and len(s.trusted) == 1
    assert verifies(s.trusted, s, T0)
    assert s.ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # A TLS server loads what it serves, and a client trusting ca.crt accepts it.
    cert_pem, key_pem = certs.leaf_pems(s)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=certs.pem_bundle(s.trusted).decode())
    assert cert_pem.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" in key_pem


def test_nothing_is_due_while_both_are_fresh_and_the_configuration_trusts_the_ca():
    _, s = issue(certs.read({}), T0)
    assert certs.plan(s, NAMES, T0 + dt.timedelta(days=200), s.trusted) == certs.Plan()
    # Not trusted yet: no write either; the keeper sets caBundle.
    assert certs.plan(s, NAMES, T0, ()) == certs.Plan()


def test_a_serving_certificate_is_renewed_by_the_same_ca_once_a_third_of_it_is_left():
    _, s = issue(certs.read({}), T0)
    later = T0 + certs.LEAF_LIFETIME - certs.LEAF_RENEW_BEFORE + dt.timedelta(hours=1)
    p, renewed = issue(s, later, s.trusted)
    assert p == certs.Plan(new_leaf=True)
    assert renewed.ca == s.ca and renewed.leaf != s.leaf and verifies(s.trusted, renewed, later)


def test_a_certificate_for_other_names_or_from_no_trusted_ca_is_replaced():
    _, s = issue(certs.read({}), T0)
    assert certs.plan(s, certs.service_names("renamed", "slurmk8s-system"), T0, s.trusted).new_leaf
    _, other = issue(certs.read({}), T0)
    mixed = certs.Stored(trusted=s.trusted, ca_key=s.ca_key, leaf=other.leaf, leaf_key=other.leaf_key)
    assert certs.plan(mixed, NAMES, T0, s.trusted) == certs.Plan(new_leaf=True)


def test_what_does_not_read_counts_as_absent():
    junk = {"ca.crt": base64.b64encode(b"not a cert").decode(), "ca.key": "%%%", "tls.crt": "", "tls.key": "eA=="}
    s = certs.read(junk)
    assert s == certs.Stored()
    assert certs.plan(s, NAMES, T0, ()) == certs.Plan(new_ca=True, new_leaf=True)


def test_a_new_ca_is_trusted_first_and_serves_only_once_the_configuration_trusts_it():
    _, s = issue(certs.read({}), T0)
    near_end = s.ca.not_valid_after_utc - certs.CA_RENEW_BEFORE + dt.timedelta(days=1)
    # The old serving certificate (renewed meanwhile) is still good: it keeps serving.
    _, s = issue(s, near_end - dt.timedelta(days=200), s.trusted)
    p, rotated = issue(s, near_end, s.trusted)
    assert p == certs.Plan(new_ca=True)
    assert rotated.ca != s.ca and rotated.trusted == (rotated.ca, s.ca) and rotated.leaf == s.leaf
    # Not yet in caBundle: the serving certificate stays the old CA's.
    assert certs.plan(rotated, NAMES, near_end, s.trusted) == certs.Plan()
    # Once it is: a serving certificate from the new CA, both still trusted.
    p, switched = issue(rotated, near_end, rotated.trusted)
    assert p == certs.Plan(new_leaf=True)
    assert switched.leaf is not None and verifies((switched.ca,), switched, near_end)
    # The old CA leaves ca.crt once expired, at the next renewal.
    gone = s.ca.not_valid_after_utc + dt.timedelta(days=1)
    _, after = issue(switched, gone + certs.LEAF_LIFETIME, switched.trusted)
    assert after.trusted == (switched.ca,)


@settings(max_examples=12, deadline=None)
@given(gaps=st.lists(st.integers(min_value=1, max_value=90 * 24), min_size=20, max_size=120),
       lag=st.booleans())
def test_over_years_of_checks_the_api_server_always_verifies_what_is_served(gaps, lag):
    """Checks come at irregular gaps of up to 90 days (the keeper's period is a minute:
    far more often), then every 60 days until twelve years have passed, so every
    example crosses a CA's renewal. After each check caBundle becomes the Secret's
    ca.crt; with ``lag`` only at the next check (a write that failed). Between
    checks the API server trusts the last caBundle and meets the last certificate."""
    now, s, bundle = T0, certs.read({}), ()
    rotations = checks = 0
    while gaps or now < T0 + dt.timedelta(days=12 * 365):
        hours = gaps.pop(0) if gaps else 60 * 24
        p, s = issue(s, now, bundle)
        rotations += p.new_ca
        checks += 1
        if not lag or not p.writes:
            bundle = s.trusted
        if bundle:
            assert verifies(bundle, s, now), (now, p)
        later = now + dt.timedelta(hours=hours)
        if bundle:  # up to the next check: nothing expires meanwhile
            assert verifies(bundle, s, later - dt.timedelta(seconds=1)), (later, p)
        now = later
    event(f"CA renewals: {rotations}")
    target(float(checks), label="checks")
    # The first CA's, and the renewal of the CA is what this is about: every example reaches it.
    assert rotations >= 2
