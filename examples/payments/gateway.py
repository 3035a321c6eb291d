"""The outside world: a payment gateway spoken to over HTTP.

`POST {url}/charges` with an `Idempotency-Key` header creates a charge (the
same key answers the same charge again); `GET {url}/charges?idempotency_key=`
looks one up (404: the gateway never saw that key).
"""

from __future__ import annotations

import os

import httpx
from django.conf import settings


class GatewayError(Exception):
    pass


def base_url() -> str:
    url = getattr(settings, "PAYMENTS_GATEWAY_URL", "") or os.environ.get("PAYMENTS_GATEWAY_URL", "")
    if not url:
        raise GatewayError("PAYMENTS_GATEWAY_URL is not set")
    return url.rstrip("/")


def charge(key: str, *, customer: str, amount_cents: int, currency: str, timeout: float = 10.0) -> dict:
    response = httpx.post(
        f"{base_url()}/charges",
        json={"customer": customer, "amount_cents": amount_cents, "currency": currency},
        headers={"Idempotency-Key": key},
        timeout=timeout,
    )
    if response.status_code not in (200, 201):
        raise GatewayError(f"the gateway answered HTTP {response.status_code}")
    return response.json()


def lookup(key: str, *, timeout: float = 10.0) -> dict | None:
    response = httpx.get(f"{base_url()}/charges", params={"idempotency_key": key}, timeout=timeout)
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise GatewayError(f"the gateway answered HTTP {response.status_code}")
    return response.json()
