"""The interactive API docs work without internet: every script, style and icon they name is served by the API."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import pytest


class AssetLinks(HTMLParser):
    """Every URL a page loads: script src, link href, img src, and the JS/CSS URLs in inline scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "redoc": "spec-url"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.urls.append(value)
        self._in_script = tag == "script"

    def handle_data(self, data: str) -> None:
        if self._in_script:  # Swagger UI's bootstrap names its bundle, CSS and the OpenAPI URL in JS
            for quoted in data.split("'"):
                if quoted.startswith(("/", "http://", "https://")) and "." in quoted.rsplit("/", 1)[-1]:
                    self.urls.append(quoted)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_every_asset_of_the_docs_page_comes_from_the_api_itself(make_client, page):
    client = make_client()
    response = client.get(page)
    assert response.status_code == 200
    parser = AssetLinks()
    parser.feed(response.text)

    assert any(url.endswith(".js") for url in parser.urls), parser.urls
    for url in parser.urls:
        absolute = urljoin(f"http://testserver{page}", url)
        assert urlparse(absolute).netloc == "testserver", f"{page} loads {url} from outside"
        assert client.get(urlparse(absolute).path).status_code == 200, url
