"""The viewer's page and its own scripts are served without auth (they hold no data); nothing else is."""

from __future__ import annotations

TOKEN = "viewer-assets-token"


def test_the_viewers_page_and_scripts_are_served_without_auth_and_nothing_else_is(make_client):
    client = make_client(api_tokens=[TOKEN])
    assert client.get("/viewer").headers["content-type"].startswith("text/html")
    page = client.get("/viewer").text
    scripts = [(name, "text/javascript") for name in ("viewer.js", "job.js", "turns.js", "run.js", "uPlot.iife.min.js")]
    for name, media in [*scripts, ("viewer.css", "text/css"), ("uPlot.min.css", "text/css")]:
        assert f"/viewer/assets/{name}" in page
        response = client.get(f"/viewer/assets/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(media)
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "http://" not in page and "https://" not in page  # no CDN: the page works offline
    assert client.get("/viewer/assets/..%2Froutes%2Fviewer.py").status_code == 404
    assert client.get("/viewer/assets/viewer.html").status_code == 404
    assert client.get("/viewer/assets/vendor%2FuPlot.LICENSE").status_code == 404
    assert client.get("/v1/jobs").status_code == 401
