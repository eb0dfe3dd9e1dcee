"""ASGI entry point: HTTP through Django, websockets through Channels (live operator UI)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from annihilation.routing import websocket_urlpatterns  # noqa: E402
from hooks.asgi import github_fast_path  # noqa: E402

application = ProtocolTypeRouter(
    {
        # GitHub's deliveries are taken before Django's middleware stack (hooks/asgi.py).
        "http": github_fast_path(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
