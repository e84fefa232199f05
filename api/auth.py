"""API keys (`Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>`: the same keys),
the admin key, and tenant -> cache_salt isolation.

Modes:
- no keys configured, bound to loopback: single-user local server, every caller is admin;
- no keys configured, bound to a network address: the API is open, the admin endpoints are closed
  (every tenant's prompt previews, flush, pin) unless the server was started with --open-admin;
- --api-key given: every API call needs one of the keys; each key belongs to a tenant whose
  requests run under their own cache salt, so tenants never share (or see) each other's prefixes;
- --admin-key: needed for the admin endpoints (prefixes, flush, pin/unpin), also accepted as an API
  key. With API keys but no admin key, the admin endpoints are disabled.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from api.config import ApiConfig
from api.errors import ApiError

TENANT_PREFIX = "tenant:"


@dataclass(frozen=True)
class Caller:
    tenant: str | None
    is_admin: bool

    def cache_salt(self, requested: str | None) -> str:
        """The salt a request runs under: the tenant's, refined by the request's own salt."""
        requested = requested or ""
        if self.tenant is None:
            return requested
        base = TENANT_PREFIX + self.tenant
        return f"{base}|{requested}" if requested else base

    def owns_salt(self, salt: str) -> bool:
        if self.is_admin:
            return True
        if self.tenant is None:
            return not salt.startswith(TENANT_PREFIX)
        base = TENANT_PREFIX + self.tenant
        return salt == base or salt.startswith(base + "|")


def _bearer(request: Request) -> str | None:
    """The key the request carries: a Bearer token, else an `x-api-key` header (Anthropic's)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = request.headers.get("x-api-key", "").strip()
    return key or None


def _find_tenant(keys: dict[str, str], token: str) -> str | None:
    found = None
    for key, tenant in keys.items():
        if hmac.compare_digest(key.encode(), token.encode()):
            found = tenant
    return found


def identify(config: ApiConfig, request: Request) -> Caller:
    """Who is calling; raises 401 when API keys are on and the request has no valid one."""
    if not config.auth_enabled:
        return Caller(tenant=None, is_admin=config.open_admin)
    token = _bearer(request)
    admin = config.admin_key
    if (
        token is not None
        and admin is not None
        and hmac.compare_digest(admin.encode(), token.encode())
    ):
        return Caller(tenant=None, is_admin=True)
    if not config.api_keys:
        return Caller(tenant=None, is_admin=False)
    if token is None:
        raise ApiError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            code="no_api_key",
        )
    tenant = _find_tenant(config.api_keys, token)
    if tenant is None:
        raise ApiError(401, "Invalid API key", code="invalid_api_key")
    return Caller(tenant=tenant, is_admin=False)


def require_admin(config: ApiConfig, request: Request) -> Caller:
    caller = identify(config, request)
    if caller.is_admin:
        return caller
    if config.admin_key is None and not config.auth_enabled:
        raise ApiError(
            403,
            "Admin endpoints are closed: the server is bound to a network address without keys;"
            " start it with --admin-key (or --open-admin to open them to every caller)",
            code="admin_closed",
        )
    if config.admin_key is None:
        raise ApiError(403, "Admin endpoints are disabled: start the server with --admin-key")
    if _bearer(request) is None:
        raise ApiError(401, "This endpoint needs the admin key", code="no_api_key")
    raise ApiError(403, "This endpoint needs the admin key", code="not_admin")
