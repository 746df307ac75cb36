"""The dashboard as an ASGI app, to mount in your own server."""

# --8<-- [start:usage]
import os

from delayq.dashboard import Settings, create_app

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
TOKEN = os.environ["DELAYQ_DASHBOARD_TOKEN"]  # 16 characters or more
app = create_app(Settings(redis_url=REDIS_URL, token=TOKEN, read_only=True))
# --8<-- [end:usage]

# The check: the app answers, and only with the token (Starlette's test client needs httpx).
import warnings  # noqa: E402

with warnings.catch_warnings():  # Starlette's notice about its httpx dependency
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

with TestClient(app, base_url="http://127.0.0.1") as client:
    assert client.get("/", follow_redirects=False).headers["location"].startswith("/login")
    page = client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200, page.status_code
