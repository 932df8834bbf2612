"""The alert rules, checked by promtool: `promtool check rules` on manifests/monitoring's
PrometheusRule and on the coredns-mixin's alerts, and `promtool test rules` over series recorded
from a running toposdns.

The recording: two scrapes of /metrics around a burst of traffic (answers from the zones to
placed and unplaced clients, and forwarded names that fail because the only upstream refuses
them). Every sample becomes an input series that grows by what it grew between the scrapes,
each minute, so the rules see toposdns's own names, labels and proportions.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import REPO, Server, copy_snapshot, dig, http_get

pytestmark = pytest.mark.integration

PROMTOOL = shutil.which("promtool")
RULES = REPO / "manifests" / "monitoring" / "prometheusrule.yaml"
MIXIN = REPO / "tests" / "monitoring" / "coredns-mixin-alerts.yaml"
TOPOLOGY = REPO / "examples" / "topology.yaml"
#: The labels Prometheus adds to every series it scrapes from a DNS pod.
TARGET = {"job": "kube-dns", "instance": "10.244.0.5:9153", "pod": "toposdns-7d4b9-xk2p9"}
#: Minutes of input; the alerts are read at EVAL, after every `for` has run out.
MINUTES = 45
EVAL = "40m"
MIXIN_RUNBOOK = "https://github.com/povilasv/coredns-mixin/tree/master/runbook.md#alert-name-"
RUNBOOK = "https://github.com/toposdns/toposdns/blob/main/docs/operations.md#"

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install -y prometheus)"
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def promtool(*args: str | Path) -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def rule_file(directory: Path) -> Path:
    """The PrometheusRule's groups as a plain rule file, as the Prometheus Operator hands them
    to Prometheus."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    path = directory / "toposdns-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}))
    return path


@needs_promtool
def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    promtool("check", "rules", rule_file(tmp_path))
    promtool("check", "rules", MIXIN)


def test_service_monitor_scrapes_the_dns_service() -> None:
    # Prometheus names the job after the Service it finds: kube-dns, the job the rules select.
    monitor = yaml.safe_load(
        (REPO / "manifests" / "monitoring" / "servicemonitor.yaml").read_text()
    )
    service = yaml.safe_load((REPO / "manifests" / "base" / "service.yaml").read_text())
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["metadata"]["name"] == "kube-dns"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= ports
    for group in yaml.safe_load(RULES.read_text())["spec"]["groups"]:
        for rule in group["rules"]:
            assert 'job="kube-dns"' in rule["expr"] or "kube_deployment" in rule["expr"]


# The recording


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith(("coredns_", "toposdns_"))
        for s in family.samples
        if not s.name.endswith("_created")
    }


def refusing_port() -> int:
    """A loopback UDP and TCP port nothing listens on: queries there are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Samples, Samples, Server]:
    """Scrapes before and after the traffic, and the server (stopped by then)."""
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    snapshot = copy_snapshot(tmp_path_factory.mktemp("alerts"), TOPOLOGY)
    upstream = f"127.0.0.1:{refusing_port()}"
    server = Server(snapshot, ("--http", "127.0.0.1:0", "--upstream", upstream))
    try:
        server.wait_ready(30)
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        before = scrape(http)
        # Half the replies SERVFAIL (the forwarded ones); two in three topology-aware answers go
        # to a client no PodLocator places (127.0.0.1).
        for source in (
            "127.0.0.1",
            "127.0.0.1",
            "127.0.0.2",
            "127.0.0.1",
            "127.0.0.1",
            "127.0.0.2",
        ):
            assert dig(server, "-b", source, "web.shop.svc.cluster.local").status == "NOERROR"
        for i in range(6):
            assert dig(server, f"n{i}.example.test").status == "SERVFAIL"
        # The upstream is probed every half second while down: let a probe fail in the window.
        probes = "coredns_proxy_healthcheck_failures_total"
        after = scrape(http)
        for _ in range(50):
            if delta(before, after, probes) > 0:
                break
            time.sleep(0.1)
            after = scrape(http)
    finally:
        server.stop(5.0)
    return before, after, server


def series_text(name: str, labels: Iterable[tuple[str, str]]) -> str:
    escaped = (f'{k}="{v}"'.replace("\\", "\\\\").replace("\n", "\\n") for k, v in labels)
    return f"{name}{{{','.join(escaped)}}}"


def input_series(before: Samples, after: Samples) -> list[dict[str, str]]:
    """Each recorded sample as a promtool input series: gauges (their names have no _total,
    _bucket, _sum or _count) keep their value, the others grow each minute by what they grew
    between the scrapes."""
    found = []
    for (name, labels), value in sorted(after.items()):
        growing = name.endswith(("_total", "_bucket", "_sum", "_count"))
        step = value - before.get((name, labels), 0.0) if growing else 0.0
        start = before.get((name, labels), 0.0) if growing else value
        found.append(
            {
                "series": series_text(name, sorted({**dict(labels), **TARGET}.items())),
                "values": f"{start:g}+{step:g}x{MINUTES}",
            }
        )
    return found


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return sum(
        value - before.get(key, 0.0)
        for key, value in after.items()
        if key[0] == name and labels.items() <= dict(key[1]).items()
    )


def percentage(value: float) -> str:
    """Prometheus's humanizePercentage."""
    return f"{value * 100:.4g}%"


def alert(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """One alert expected to fire."""
    return {"exp_labels": labels, "exp_annotations": annotations}


def run_tests(directory: Path, rules: Path, tests: list[dict[str, Any]]) -> None:
    path = directory / "tests.yaml"
    path.write_text(
        yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests})
    )
    promtool("test", "rules", path)


def expect(eval_time: str, **alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """alert_rule_test entries: alert name -> the alerts expected to fire."""
    return [
        {
            "eval_time": eval_time,
            "alertname": name,
            "exp_alerts": fired,
        }
        for name, fired in alerts.items()
    ]


def up(value: int) -> dict[str, str]:
    return {"series": series_text("up", sorted(TARGET.items())), "values": f"{value}x{MINUTES}"}


def test_coredns_mixin_alerts_over_toposdns_series(
    recorded: tuple[Samples, Samples, Server], tmp_path: Path
) -> None:
    before, after, server = recorded
    servfail = delta(before, after, "coredns_dns_responses_total", rcode="SERVFAIL")
    total = delta(before, after, "coredns_dns_responses_total")
    assert (servfail, total) == (6, 12)
    errors = {
        "summary": "CoreDNS is returning SERVFAIL.",
        "description": f"CoreDNS is returning SERVFAIL for {percentage(servfail / total)} of "
        "requests.",
        "runbook_url": MIXIN_RUNBOOK + "corednserrorshigh",
    }
    broken = {
        "summary": "CoreDNS health checks have failed for all upstream servers.",
        "description": "CoreDNS health checks have failed for all upstream servers.",
        "runbook_url": MIXIN_RUNBOOK + "corednsforwardhealthcheckbrokencount",
    }
    job = {"job": "kube-dns"}
    as_recorded = {
        "interval": "1m",
        "input_series": [up(1), *input_series(before, after)],
        "alert_rule_test": expect(
            EVAL,
            CoreDNSDown=[],
            CoreDNSLatencyHigh=[],  # answered in milliseconds
            CoreDNSErrorsHigh=[
                alert({"severity": "critical", **job}, errors),
                alert({"severity": "warning", **job}, errors),
            ],
            # These three read coredns_forward_* series that CoreDNS 1.14 no longer exports.
            CoreDNSForwardLatencyHigh=[],
            CoreDNSForwardErrorsHigh=[],
            CoreDNSForwardHealthcheckFailureCount=[],
            CoreDNSForwardHealthcheckBrokenCount=[alert({"severity": "warning", **job}, broken)],
        ),
    }
    # The same label sets, every query slower than the largest bucket, and the target gone.
    buckets = [
        {
            "series": series_text(name, sorted({**dict(labels), **TARGET}.items())),
            "values": f"0+{100 if dict(labels)['le'] == '+Inf' else 0}x{MINUTES}",
        }
        for name, labels in after
        if name == "coredns_dns_request_duration_seconds_bucket"
    ]
    highest = max(
        float(dict(labels)["le"])
        for name, labels in after
        if name == "coredns_dns_request_duration_seconds_bucket"
        and not math.isinf(float(dict(labels)["le"]))
    )
    dns_server = f"dns://127.0.0.1:{server.port}"
    slow_and_gone = {
        "interval": "1m",
        "input_series": [up(0), *buckets],
        "alert_rule_test": expect(
            EVAL,
            CoreDNSDown=[
                alert(
                    {"severity": "critical"},  # absent() of a comparison has no labels
                    {
                        "summary": "CoreDNS has disappeared from Prometheus target discovery.",
                        "description": "CoreDNS has disappeared from Prometheus target discovery.",
                        "runbook_url": MIXIN_RUNBOOK + "corednsdown",
                    },
                )
            ],
            CoreDNSLatencyHigh=[
                alert(
                    {"severity": "critical", "server": dns_server, "zone": ".", **job},
                    {
                        "summary": "CoreDNS is experiencing high 99th percentile latency.",
                        "description": f"CoreDNS has 99th percentile latency of {highest:g} "
                        f"seconds for server {dns_server} zone . .",
                        "runbook_url": MIXIN_RUNBOOK + "corednslatencyhigh",
                    },
                )
            ],
        ),
    }
    run_tests(tmp_path, MIXIN, [as_recorded, slow_and_gone])


def test_toposdns_alerts_over_toposdns_series(
    recorded: tuple[Samples, Samples, Server], tmp_path: Path
) -> None:
    before, after, _ = recorded
    job = {"job": "kube-dns"}
    forwarded = delta(before, after, "coredns_dns_responses_total", plugin="forward")
    assert delta(before, after, "coredns_dns_responses_total", rcode="SERVFAIL") == forwarded == 6
    unplaced = delta(before, after, "toposdns_unplaced_client_queries_total")
    topology = delta(before, after, "toposdns_topology_answers_total")
    assert (unplaced, topology) == (4, 6)
    assert delta(before, after, "coredns_forward_healthcheck_broken_total") > 0
    (to,) = {
        dict(labels)["to"]
        for name, labels in after
        if name == "coredns_proxy_healthcheck_failures_total"
    }

    def fired(name: str, labels: dict[str, str], summary: str, description: str) -> Any:
        annotations = {
            "summary": summary,
            "description": description,
            "runbook_url": RUNBOOK + name.lower(),
        }
        return [alert(labels, annotations)]

    as_recorded = {
        "interval": "1m",
        "input_series": [up(1), *input_series(before, after)],
        "alert_rule_test": expect(
            EVAL,
            TopoDNSDown=[],
            TopoDNSInstanceDown=[],
            TopoDNSPodsNotReady=[],
            TopoDNSNotSynced=[],
            TopoDNSKubernetesAPIErrors=[],
            TopoDNSReloadFailed=[],
            TopoDNSPanics=[],
            TopoDNSLatencyHigh=[],
            TopoDNSServfailHigh=fired(
                "TopoDNSServfailHigh",
                {"severity": "warning", **job},
                "toposdns answers SERVFAIL too often.",
                f"{percentage(0.5)} of replies are SERVFAIL.",
            ),
            TopoDNSForwardErrorsHigh=fired(
                "TopoDNSForwardErrorsHigh",
                {"severity": "warning", **job},
                "Forwarded queries fail.",
                f"{percentage(1)} of forwarded queries get SERVFAIL.",
            ),
            TopoDNSUpstreamUnhealthy=fired(
                "TopoDNSUpstreamUnhealthy",
                {"severity": "warning", "to": to, **job},
                "An upstream fails its health checks.",
                f"Upstream {to} has failed health checks for 10 minutes.",
            ),
            TopoDNSUpstreamsAllUnhealthy=fired(
                "TopoDNSUpstreamsAllUnhealthy",
                {"severity": "critical", **job},
                "Every upstream is unhealthy.",
                "Every upstream has been unhealthy at once for 5 minutes; names outside the "
                "cluster fail.",
            ),
            TopoDNSUnplacedClientsHigh=fired(
                "TopoDNSUnplacedClientsHigh",
                {"severity": "warning", **job},
                "Many clients of topology-aware services are not placed.",
                f"{percentage(unplaced / topology)} of topology-aware answers went to clients no "
                "PodLocator places; they get every endpoint.",
            ),
        ),
    }
    # A pod in trouble: down, never synced, its API watch failing, a reload refused and an
    # internal error, on toposdns's own label sets; and kube-state-metrics seeing 1 of 2 ready.
    pod = TARGET["pod"]
    state = {"namespace": "kube-system", "deployment": "toposdns", "job": "kube-state-metrics"}
    troubled = {
        "interval": "1m",
        "input_series": [
            up(0),
            {
                "series": series_text("toposdns_source_synced", sorted(TARGET.items())),
                "values": f"0x{MINUTES}",
            },
            *(
                {
                    "series": series_text(name, sorted({**extra, **TARGET}.items())),
                    "values": f"0+1x{MINUTES}",
                }
                for name, extra in (
                    ("toposdns_kubernetes_api_errors_total", {"resource": "services"}),
                    ("coredns_reload_failed_total", {}),
                    ("coredns_panics_total", {}),
                )
            ),
            {
                "series": series_text(
                    "kube_deployment_status_replicas_available", sorted(state.items())
                ),
                "values": f"1x{MINUTES}",
            },
            {
                "series": series_text("kube_deployment_spec_replicas", sorted(state.items())),
                "values": f"2x{MINUTES}",
            },
        ],
        "alert_rule_test": expect(
            EVAL,
            TopoDNSDown=fired(
                "TopoDNSDown",
                {"severity": "critical"},
                "No toposdns pod is scraped up.",
                "No target of job kube-dns has been up for 5 minutes; cluster DNS is down or "
                "unscraped.",
            ),
            TopoDNSInstanceDown=fired(
                "TopoDNSInstanceDown",
                {"severity": "warning", **TARGET},
                "A toposdns pod cannot be scraped.",
                f"{TARGET['instance']} ({pod}) has not answered /metrics for 5 minutes.",
            ),
            TopoDNSPodsNotReady=fired(
                "TopoDNSPodsNotReady",
                {"severity": "warning", **state},
                "Some toposdns pods are not ready.",
                "Only 1 toposdns pods are available, fewer than the Deployment asks for, for 10 "
                "minutes.",
            ),
            TopoDNSNotSynced=fired(
                "TopoDNSNotSynced",
                {"severity": "critical", **TARGET},
                "A toposdns pod has not synced with the cluster.",
                f"{pod} has not listed every watched resource for 5 minutes: it answers SERVFAIL "
                "for names it does not know and /ready fails.",
            ),
            TopoDNSKubernetesAPIErrors=fired(
                "TopoDNSKubernetesAPIErrors",
                {"severity": "warning", "job": "kube-dns", "pod": pod},
                "A toposdns pod cannot watch the Kubernetes API.",
                f"{pod} has had failed list or watch requests for 15 minutes; it answers from "
                "the data it last had.",
            ),
            TopoDNSReloadFailed=fired(
                "TopoDNSReloadFailed",
                {"severity": "warning", "job": "kube-dns", "pod": pod},
                "A toposdns pod refused its new configuration.",
                f"{pod} refused a changed configuration and serves the previous one.",
            ),
            TopoDNSPanics=fired(
                "TopoDNSPanics",
                {"severity": "warning", "job": "kube-dns", "pod": pod},
                "toposdns hit internal errors.",
                f"{pod} answered queries SERVFAIL after internal errors in the last 10 minutes; "
                "the tracebacks are in its log.",
            ),
        ),
    }
    run_tests(tmp_path, rule_file(tmp_path), [as_recorded, troubled])
