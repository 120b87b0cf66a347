"""Device provisioning: make sure the devices of a run exist and know their
MQTT credentials.

* :class:`TbRestProvisioner` talks to a ThingsBoard-style REST API.
* :class:`NoProvisioner` is for a plain broker: nothing to create, the token
  is the device name.
* :class:`HonoRegistryProvisioner` talks to Eclipse Hono's Device Registry
  Management API: a tenant, its devices and their hashed-password and PSK credentials.
"""

from __future__ import annotations
from dataclasses import dataclass

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter


__all__ = ["HonoRegistryProvisioner", "NoProvisioner", "ProvisionError", "TbRestProvisioner", "device_names",
           "provisioner_for", "psk_credential", "psk_key"]

DEVICE_TYPE = "monsoon"
#: the device profile monsoon's devices use, created once before them (``POST /api/deviceProfile``): real
#: ThingsBoard 4.2.1 creates a missing profile inside each device create, and concurrent creates then race on
#: device_profile_name_unq_key (500 "Database error").
DEVICE_PROFILE = {
    "name": DEVICE_TYPE, "type": "DEFAULT", "transportType": "DEFAULT", "provisionType": "DISABLED",
    "description": "devices created by monsoon",
    "profileData": {"configuration": {"type": "DEFAULT"}, "transportConfiguration": {"type": "DEFAULT"},
                    "provisionConfiguration": {"type": "DISABLED"}},
}
#: TB answers 429 when a tenant's REST rate limit is exceeded: wait and retry (seconds between attempts)
RATE_LIMIT_WAITS = (0.5, 1, 2, 4, 8)


class ProvisionError(RuntimeError):
    """A provisioning call failed; the message names URL, status and body."""


def device_names(prefix: str, n: int) -> list[tuple[str, str]]:
    """``n`` (name, token) pairs: names ``f"{prefix}-{i:05d}"``, tokens derived
    deterministically from the name (so a re-run reuses the same devices and
    credentials), 20 hex characters."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out = []
    for i in range(n):
        name = f"{prefix}-{i:05d}"
        token = hashlib.sha256(f"monsoon-token:{name}".encode()).hexdigest()[:20]
        out.append((name, token))
    return out


def _body_text(resp: requests.Response) -> str:
    """TB errors are JSON with a "message"; fall back to the raw body."""
    text = resp.text or ""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return text.strip()[:500]


class NoProvisioner:
    """For a plain MQTT broker: no devices to create; token = name."""

    def login(self) -> None:
        pass

    def ensure_devices(self, names_and_tokens: list[tuple[str, str]]) -> list[Device]:
        return [Device(name, name) for name, _ in names_and_tokens]

    def delete_devices(self, names: Iterable[str]) -> None:
        pass

    def close(self) -> None:
        pass


class TbRestProvisioner:
    """Create/look up/delete devices through ThingsBoard's REST API.

    Thread-safe: ``ensure_devices`` fans out over a pool of ``workers``
    threads sharing one ``requests.Session`` (connection pool sized to the
    pool); the auth header is built per request, never stored on the session.
    A 401 on any call refreshes the JWT once (``POST /api/auth/token``, or a
    fresh login if the refresh token is rejected) and retries the call.
    """

    def __init__(
        self,
        base_url: str,
        username: str,
        password: str,
        timeout: float = 10,
        *,
        workers: int = 8,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.timeout = timeout
        self.workers = workers
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(workers, 1))
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._token: str | None = None
        self._refresh: str | None = None
        self._gen = 0  # bumped on every new token, so concurrent 401s refresh once
        self._auth_lock = threading.Lock()
        self._reauth_lock = threading.Lock()

    # ----------------------------------------------------------------- auth
    def _post_json(self, what: str, path: str, body: dict[str, Any]) -> requests.Response:
        url = self.base_url + path
        try:
            return self._session.post(url, json=body, timeout=self.timeout)
        except requests.RequestException as e:
            raise ProvisionError(f"{what} {url} failed: {type(e).__name__}: {e}") from e

    def login(self) -> None:
        """POST /api/auth/login; keeps the JWT and refresh token."""
        resp = self._post_json(
            "login to", "/api/auth/login", {"username": self.username, "password": self.password}
        )
        if resp.status_code != 200:
            raise ProvisionError(
                f"login to {self.base_url} failed: {resp.status_code} {_body_text(resp)}"
            )
        data = resp.json()
        with self._auth_lock:
            self._token = data["token"]
            self._refresh = data.get("refreshToken")
            self._gen += 1

    def _reauth(self, seen_gen: int) -> None:
        with self._reauth_lock:  # one refresh at a time; the others reuse it
            with self._auth_lock:
                if self._gen != seen_gen:
                    return  # another thread already got a fresh token
                refresh = self._refresh
            self._reauth_locked(refresh)

    def _reauth_locked(self, refresh: str | None) -> None:
        if refresh:
            resp = self._post_json("token refresh at", "/api/auth/token", {"refreshToken": refresh})
            if resp.status_code == 200:
                data = resp.json()
                with self._auth_lock:
                    self._token = data["token"]
                    self._refresh = data.get("refreshToken", refresh)
                    self._gen += 1
                return
        self.login()

    def _request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), **kw: Any
    ) -> requests.Response:
        """One authenticated call; returns the response if its status is in
        ``ok`` (404 may be listed), raises ProvisionError otherwise."""
        if self._token is None:
            self.login()
        url = self.base_url + path
        reauthed, waits = False, list(RATE_LIMIT_WAITS)
        while True:
            with self._auth_lock:
                token, gen = self._token, self._gen
            try:
                resp = self._session.request(
                    method, url, headers={"X-Authorization": f"Bearer {token}"},
                    timeout=self.timeout, **kw,
                )
            except requests.RequestException as e:
                raise ProvisionError(f"{method} {url} failed: {type(e).__name__}: {e}") from e
            if resp.status_code == 401 and not reauthed:
                reauthed = True
                self._reauth(gen)
                continue
            if resp.status_code == 429 and waits:   # TB's REST rate limit: {"status": 429, "errorCode": 33}
                time.sleep(waits.pop(0))
                continue
            if resp.status_code in ok:
                return resp
            raise ProvisionError(f"{method} {url} failed: {resp.status_code} {_body_text(resp)}")

    # -------------------------------------------------------------- devices
    def _find_profile(self) -> dict[str, Any] | None:
        resp = self._request("GET", f"/api/deviceProfiles?pageSize=100&page=0&textSearch={quote(DEVICE_TYPE)}")
        return next((p for p in resp.json().get("data", []) if p.get("name") == DEVICE_TYPE), None)

    def ensure_profile(self) -> None:
        """The devices' profile, created once before them (a concurrent monsoon may win the create: look again)."""
        if self._find_profile() is not None:
            return
        try:
            self._request("POST", "/api/deviceProfile", json=DEVICE_PROFILE)
        except ProvisionError:
            if self._find_profile() is None:
                raise

    def _find(self, name: str) -> dict[str, Any] | None:
        resp = self._request(
            "GET", f"/api/tenant/devices?deviceName={quote(name, safe='')}", ok=(200, 404)
        )
        return None if resp.status_code == 404 else resp.json()

    def _credentials(self, device: dict[str, Any]) -> str:
        dev_id = device["id"]["id"]
        resp = self._request("GET", f"/api/device/{dev_id}/credentials")
        return resp.json()["credentialsId"]

    def _ensure_one(self, name: str, token: str) -> Device:
        existing = self._find(name)
        if existing is None:
            try:
                self._request(
                    "POST", f"/api/device?accessToken={quote(token, safe='')}",
                    json={"name": name, "type": DEVICE_TYPE},
                )
                return Device(name, token)
            except ProvisionError as e:
                # lost a race with a concurrent creator: look it up again
                existing = self._find(name)
                if existing is None:
                    raise e
        return Device(name, self._credentials(existing))

    def ensure_devices(self, names_and_tokens: list[tuple[str, str]]) -> list[Device]:
        """Idempotent: create the missing devices (with the given token),
        return every device with its *real* token, in input order."""
        if self._token is None:
            self.login()
        if not names_and_tokens:
            return []
        self.ensure_profile()
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="monsoon-provision") as pool:
            return list(pool.map(lambda nt: self._ensure_one(*nt), names_and_tokens))

    def _delete_one(self, name: str) -> None:
        existing = self._find(name)
        if existing is not None:
            self._request("DELETE", f"/api/device/{existing['id']['id']}", ok=(200, 404))

    def delete_devices(self, names: Iterable[str]) -> None:
        """Delete the named devices; absent ones are fine."""
        names = list(names)
        if self._token is None:
            self.login()
        if not names:
            return
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="monsoon-provision") as pool:
            list(pool.map(self._delete_one, names))

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> TbRestProvisioner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Device:
    name: str
    token: str                    # the MQTT user name (TB's access token; Hono's <auth-id>@<tenant>)
    password: str | None = None   # the MQTT password, where the platform wants one (Hono)


def password_secret(password: str, hash_function: str = "bcrypt", salt: bytes | None = None) -> dict[str, str]:
    """A Hono ``hashed-password`` secret: ``bcrypt``: the plain password, hashed by the registry (``pwd-plain``);
    ``sha-256``: ``pwd-hash`` = Base64(SHA-256(salt + UTF-8 password)) with its Base64 ``salt``, as Hono's
    ``MessageDigestPasswordEncoder`` checks it."""
    if hash_function == "bcrypt":
        return {"pwd-plain": password}
    salt = os.urandom(8) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return {"hash-function": "sha-256", "pwd-hash": base64.b64encode(digest).decode(),
            "salt": base64.b64encode(salt).decode()}


def psk_key(secret: str) -> bytes:
    """A device's pre-shared key for CoAP over DTLS: 16 bytes derived from its ``secret`` (SHA-256, cut): tinydtls
    (aiocoap's DTLS) takes keys of at most 16 bytes and answers a longer one with an internal-error alert."""
    return hashlib.sha256(secret.encode()).digest()[:16]


def psk_credential(auth_id: str, secret: str, encoding: str = "base64url") -> dict[str, Any]:
    """A Hono ``psk`` credential: CoAP devices authenticate in the DTLS handshake with identity
    ``<auth-id>@<tenant>`` and the key :func:`psk_key` derives from ``secret`` (the registry holds it Base64url: ``key``)."""
    # Base64url: the registry reads binary JSON fields as Vert.x does (a standard "+" or "/" is a 400); base64: a
    # registry run with -Dvertx.json.base64=legacy, as Hono's images run it (there a "-" or "_" is the 400)
    key = psk_key(secret)
    text = base64.b64encode(key) if encoding == "base64" else base64.urlsafe_b64encode(key)
    return {"type": "psk", "auth-id": auth_id, "secrets": [{"key": text.decode()}]}


class HonoRegistryProvisioner:
    """Eclipse Hono's Device Registry Management API (``/v1/tenants``, ``/v1/devices``, ``/v1/credentials``):
    ``ensure_devices`` creates the tenant (once) and each device with a ``hashed-password`` credential whose
    auth-id is the device name and whose password is its token (the registry hashes it: ``pwd-plain``), and a
    ``psk`` credential of the same auth-id whose key derives from that token (:func:`psk_key`, CoAP over DTLS);
    devices then log in as
    ``<name>@<tenant>``. Idempotent (409 on create = already there; the credentials are
    set again). ``delete_devices`` deletes the devices, then the tenant. The JDBC registry takes a few hundred
    calls a second here; ``workers`` parallel calls."""

    delete_after_run = True    # a run deletes what it created (the devices, then the tenant) when it ends

    def __init__(self, base_url: str, tenant: str, timeout: float = 10, *, workers: int = 8,
                 password_hash: str = "bcrypt", psk_key_encoding: str = "base64url") -> None:
        self.base_url, self.tenant, self.timeout, self.workers = base_url.rstrip("/"), tenant, timeout, workers
        if password_hash not in ("bcrypt", "sha-256"):
            raise ValueError(f"password_hash must be bcrypt or sha-256, got {password_hash!r}")
        self.password_hash = password_hash
        if psk_key_encoding not in ("base64url", "base64"):
            raise ValueError(f"psk_key_encoding must be base64url or base64, got {psk_key_encoding!r}")
        self.psk_key_encoding = psk_key_encoding
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(workers, 1))
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def _call(self, method: str, path: str, ok: tuple[int, ...], **kw: Any) -> requests.Response:
        url = self.base_url + path
        try:
            resp = self._session.request(method, url, timeout=self.timeout, **kw)
        except requests.RequestException as e:
            raise ProvisionError(f"{method} {url} failed: {type(e).__name__}: {e}") from e
        if resp.status_code not in ok:
            raise ProvisionError(f"{method} {url} failed: {resp.status_code} {_body_text(resp)}")
        return resp

    def login(self) -> None:
        """The tenant, created if missing (the management API itself has no login here)."""
        self._call("POST", f"/v1/tenants/{quote(self.tenant, safe='')}", (201, 409), json={"enabled": True})

    def _ensure_one(self, name: str, token: str) -> Device:
        t, d = quote(self.tenant, safe=""), quote(name, safe="")
        self._call("POST", f"/v1/devices/{t}/{d}", (201, 409), json={"enabled": True})
        self._call("PUT", f"/v1/credentials/{t}/{d}", (204,),
                   json=[{"type": "hashed-password", "auth-id": name, "secrets": [password_secret(token, self.password_hash)]},
                         psk_credential(name, token, self.psk_key_encoding)])
        return Device(name, f"{name}@{self.tenant}", token)

    def ensure_devices(self, names_and_tokens: list[tuple[str, str]]) -> list[Device]:
        self.login()
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="monsoon-provision") as pool:
            return list(pool.map(lambda nt: self._ensure_one(*nt), names_and_tokens))

    def delete_devices(self, names: Iterable[str]) -> None:
        """Delete the named devices (their credentials go with them), then the tenant; absent ones are fine."""
        t = quote(self.tenant, safe="")
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="monsoon-provision") as pool:
            list(pool.map(lambda n: self._call("DELETE", f"/v1/devices/{t}/{quote(n, safe='')}", (204, 404)),
                          list(names)))
        self._call("DELETE", f"/v1/tenants/{t}", (204, 404))

    def close(self) -> None:
        self._session.close()


def provisioner_for(prov, endpoint=lambda s: s):
    """The provisioner of a stack's ``provisioning`` spec (``endpoint`` resolves its ``{port:..}``)."""
    if prov.kind == "none":
        return NoProvisioner()
    if prov.kind == "hono-registry":
        return HonoRegistryProvisioner(endpoint(prov.url), prov.tenant, password_hash=prov.password_hash,
                                       psk_key_encoding=prov.psk_key_encoding)
    return TbRestProvisioner(endpoint(prov.url), prov.username, prov.password)
