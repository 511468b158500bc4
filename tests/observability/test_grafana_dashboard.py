"""The Grafana dashboard (ops/grafana/rollouts.json) asks only for metrics the service exports.

The names come from the service's own exposition (`GET /metrics` of a fresh app), not from a list
kept by hand, so a renamed or removed family fails here before an operator sees an empty panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "rollouts.json"
METRIC = re.compile(r"\brollouts_[a-z0-9_]+\b")
SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exported_series(exposition: str) -> set[str]:
    """Every series name a query may select: a family's own name, or its type's suffixed ones."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SERIES.get(family.type, ()))
    return names


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' nested panels included, and every variable."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            yield f"variable {variable['name']}", str(variable.get("query"))


def test_every_panel_queries_metrics_the_service_exports(settings):
    with TestClient(create_app(settings)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    exported = exported_series(response.text)
    dashboard = json.loads(DASHBOARD.read_text())

    asked = list(queries(dashboard))
    unknown = [(title, name) for title, expr in asked for name in METRIC.findall(expr) if name not in exported]
    assert not unknown, f"panels name metrics /metrics does not export: {unknown}"
    assert all(METRIC.search(expr) for _, expr in asked), "a query names no rollouts metric"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels), "a panel without a query"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids repeat"
