"""How the API knows who calls, whatever the host site's REST_FRAMEWORK says.

DRF answers an anonymous call with the challenge of the first authentication class, and with 403 when that
class has none. Django's session has none, so on a site without rest_framework.authtoken every anonymous call
would be a 403 that looks like a refusal of a signed-in user. The app's session authentication names a
challenge of its own, so an anonymous call is a 401 with WWW-Authenticate, as HTTP asks.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication
from rest_framework.request import Request


class SessionAuthentication(authentication.SessionAuthentication):
    """Django's session (with DRF's CSRF check on writes), answering an anonymous call with a challenge."""

    def authenticate_header(self, request: Request) -> str:
        return 'Session realm="durableruns"'


class SessionScheme(OpenApiAuthenticationExtension):
    """The session cookie in the OpenAPI document, as drf-spectacular documents DRF's own session class."""

    target_class = "durableruns.api.authentication.SessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME}
