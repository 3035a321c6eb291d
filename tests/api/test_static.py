"""The operator surfaces work offline: the admin's CSS and the API docs'
assets are served by the app itself (WhiteNoise over the staticfiles
finders, drf-spectacular-sidecar), never fetched from a CDN."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def test_the_api_docs_load_their_assets_from_this_server(alice, as_user, anon):
    client = as_user(alice)
    for page in ("/api/docs/", "/api/docs/redoc/"):
        html = client.get(page).content.decode()
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)
        assert assets, html[:500]
        assert not [a for a in assets if a.startswith(("http:", "https:", "//"))], assets
        assert not re.search(r"cdn\.jsdelivr|unpkg\.com|cdnjs", html)
        for asset in assets:
            response = anon.get(asset)  # static files need no login
            assert response.status_code == 200, asset
            assert b"".join(response.streaming_content)


def test_the_admin_is_styled_without_debug_or_collectstatic(anon, settings):
    assert settings.DEBUG is False and settings.STATIC_ROOT is None
    response = anon.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
