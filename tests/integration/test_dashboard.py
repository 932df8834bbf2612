"""The Grafana dashboard in manifests/monitoring: a ConfigMap kube-prometheus's Grafana sidecar
loads, whose every panel's query parses (`promtool check rules`, each query a recording rule)
and reads only series that toposdns exports (the families a running server's /metrics lists,
with the sample names each type gives)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import REPO, Server, copy_snapshot, http_get

pytestmark = pytest.mark.integration

PROMTOOL = shutil.which("promtool")
DASHBOARD = REPO / "manifests" / "monitoring" / "dashboard.yaml"
#: Grafana's interval variable, as Grafana fills it in for a 1m scrape interval.
RATE_INTERVAL = "4m"
#: Words of PromQL that are not series: aggregations, their clauses and the functions used.
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "bool", "offset", "rate", "irate", "increase",
    "delta", "histogram_quantile", "clamp_min", "clamp_max", "topk", "bottomk", "le", "inf",
}  # fmt: skip
#: The sample names each metric type exposes.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
    "summary": ("_sum", "_count", ""),
}


def dashboard() -> tuple[dict[str, Any], dict[str, Any]]:
    """The ConfigMap and the dashboard it carries."""
    config_map = yaml.safe_load(DASHBOARD.read_text())
    ((_, text),) = config_map["data"].items()
    return config_map, json.loads(text)


def queries() -> list[tuple[str, str]]:
    """(panel title, query) for every panel's every target."""
    _, board = dashboard()
    found = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        found += [(panel["title"], target["expr"]) for target in panel["targets"]]
    return found


def series_names(expr: str) -> set[str]:
    """The series a query reads: its identifiers, without label matchers, grouping labels,
    ranges, strings and PromQL's own words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {word for word in words if word.lower() not in PROMQL_WORDS}


def test_the_dashboard_is_a_config_map_the_grafana_sidecar_loads() -> None:
    config_map, board = dashboard()
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["uid"] == "toposdns" and board["title"] == "toposdns"
    titles = {panel["title"] for panel in board["panels"]}
    for wanted in (
        "Requests by type",
        "Responses by rcode",
        "Latency",
        "Cache hits and misses",
        "Forwarded requests by rcode",
        "Answers by tier",
        "Spill-overs",
        "Weighted replies",
        "Unplaced clients",
        "Unplaced client subnets",
        "Locator conflicts",
    ):
        assert wanted in titles
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)"
)
def test_every_panel_query_parses(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", RATE_INTERVAL)}
        for i, (_, expr) in enumerate(queries())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_name_check_sees_every_series() -> None:
    # The check below is only as good as this: a misspelt series must be caught.
    expr = 'sum by (le) (rate(coredns_dns_request_duration_seconds_bucket{job="kube-dns"}[5m]))'
    assert series_names(f"histogram_quantile(0.99, {expr})") == {
        "coredns_dns_request_duration_seconds_bucket"
    }
    assert series_names("sum(rate(toposdns_spillovers_total[1h])) / 2") == {
        "toposdns_spillovers_total"
    }


def test_every_panel_reads_series_toposdns_exports(tmp_path: Path) -> None:
    server = Server(copy_snapshot(tmp_path), ("--http", "127.0.0.1:0"))
    try:
        server.wait_ready(30)
        port = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        status, text = http_get(port, "/metrics")
    finally:
        server.stop(5.0)
    assert status == 200
    exported = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }
    for title, expr in queries():
        unknown = series_names(expr) - exported
        assert not unknown, f"panel {title!r} reads {sorted(unknown)}, which toposdns never exports"
