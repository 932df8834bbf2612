"""The `toposdns` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from toposdns import __version__
from toposdns.config import (
    DEFAULT_RESOLV_CONF,
    POD_MODES,
    ConfigError,
    resolver_config,
    serve_config,
)
from toposdns.logs import configure_logging
from toposdns.source.snapshot_file import SnapshotError

log = logging.getLogger("toposdns")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with one sub-command per job."""
    parser = argparse.ArgumentParser(
        prog="toposdns",
        description="Kubernetes cluster DNS that answers like CoreDNS, with topology-aware "
        "headless services.",
    )
    parser.add_argument("--version", action="version", version=f"toposdns {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="answer DNS queries over UDP and TCP")
    serve.add_argument(
        "--snapshot",
        type=Path,
        metavar="FILE",
        help="serve the objects in this YAML/JSON file, reloaded when it changes "
        "(default: watch the cluster)",
    )
    serve.add_argument(
        "--snapshot-max-bytes",
        default="64Mi",
        metavar="SIZE",
        help="refuse a larger --snapshot file, e.g. 512Ki, 64Mi, 1Gi (default %(default)s)",
    )
    serve.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="without --snapshot: this kubeconfig (default: in-cluster, else ~/.kube/config)",
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /health, /ready, /explain and /metrics here, for local use (default: off)",
    )
    for flag, what in (
        ("health", "/health, the liveness probe (CoreDNS's health: :8080)"),
        ("ready", "/ready, the readiness probe (CoreDNS's ready: :8181)"),
        ("metrics", "/metrics, for Prometheus (CoreDNS's prometheus: :9153)"),
        ("explain", "/explain, where clients and endpoints are placed: keep it private"),
    ):
        serve.add_argument(
            f"--{flag}", metavar="HOST:PORT", help=f"serve {what} here (default: off)"
        )
    serve.add_argument(
        "--startup-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long for the first sync with the cluster (default %(default)s)",
    )
    serve.add_argument(
        "--listen",
        default="0.0.0.0:53",
        metavar="HOST:PORT",
        help="DNS address, UDP and TCP (default %(default)s; port 0 picks one)",
    )
    _add_answer_options(serve)
    serve.add_argument(
        "--ecs-trust",
        default="",
        metavar="CIDR[,CIDR]",
        help="take the client address from EDNS Client Subnet when the query comes from these "
        "networks, e.g. the CoreDNS pods that forward to toposdns (default: none)",
    )
    serve.add_argument(
        "--upstream",
        metavar="IP[:PORT],...",
        help="forward names outside the zones here ('none': refuse them). Default: the "
        "nameservers of /etc/resolv.conf when watching a cluster, none with --snapshot",
    )
    serve.add_argument(
        "--max-concurrent",
        type=int,
        default=1000,
        metavar="N",
        help="forward at most N queries at once; more get REFUSED, as CoreDNS's forward "
        "max_concurrent (default %(default)s, as kubeadm's Corefile)",
    )
    serve.add_argument(
        "--cache-max-ttl",
        type=int,
        metavar="SECONDS",
        help="keep forwarded answers and denials at most this long, as CoreDNS's `cache SECONDS` "
        "(kubeadm: 30; default 3600 for answers, 1800 for denials)",
    )
    for kind, what in (("success", "answers"), ("denial", "NXDOMAIN/NODATA/SERVFAIL")):
        serve.add_argument(
            f"--cache-{kind}",
            metavar="CAPACITY[,TTL[,MINTTL]]",
            help=f"the cache of forwarded {what}, as CoreDNS cache's `{kind} CAPACITY TTL "
            "MINTTL` (default 10000 entries, minimum TTL 5)",
        )
    serve.add_argument(
        "--cache-disable",
        action="append",
        default=[],
        metavar="success|denial[:ZONE,...]",
        help="do not cache forwarded answers (success) or denials in these zones (default: "
        "everywhere), as CoreDNS cache's `disable`; repeatable",
    )
    serve.add_argument(
        "--loadbalance",
        action="store_true",
        help="vary the order of A, AAAA and MX records from reply to reply "
        "(CoreDNS `loadbalance round_robin`)",
    )
    serve.add_argument(
        "--lameduck",
        default="5s",
        metavar="DURATION",
        help="after SIGTERM, keep answering this long while /ready fails (default %(default)s)",
    )
    serve.add_argument(
        "--tcp-idle-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="close TCP connections idle this long (default %(default)s)",
    )
    serve.add_argument(
        "--tcp-read-timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="close a TCP connection when a query's bytes take longer than this to arrive "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="answer DNS in N processes sharing the port, fed by one source (default: the CPUs "
        "this process may use: its CPU affinity and cgroup CPU limit; 1: a single process)",
    )
    serve.add_argument(
        "--tcp-max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="refuse TCP connections beyond this many (default %(default)s)",
    )
    _add_log_options(serve)

    explain = commands.add_parser(
        "explain",
        help="show why a client gets the records it gets",
        description="Resolve NAME for the client at --client and show how: the locator that "
        "placed the client, the service's topology policy, the tier that matched, the "
        "candidates and the records returned.",
    )
    explain.add_argument("--snapshot", type=Path, metavar="FILE", required=True)
    explain.add_argument(
        "--client", required=True, metavar="IP", help="the client's address (a pod or node IP)"
    )
    explain.add_argument("--json", action="store_true", help="print JSON for tools")
    explain.add_argument("name", help="the query name, e.g. web.shop.svc.cluster.local")
    explain.add_argument("type", nargs="?", default="A", help="record type (default A)")
    _add_answer_options(explain)
    _add_controller_parser(commands)
    return parser


def _add_controller_parser(commands: argparse._SubParsersAction[Any]) -> None:
    from toposdns.controller.config import DEFAULT_LABEL_KEYS, LeaseSettings, add_cidr_options

    lease = LeaseSettings()
    controller = commands.add_parser(
        "controller",
        help="maintain a PodLocator per node, and per pod its node's does not place "
        "(leader-elected)",
        description="Watch Pods and Nodes and keep one PodLocator per node in --namespace "
        "(its InternalIPs and pod ranges), and one per pod that has an IP and a node and that "
        "its node's locator does not place (--pod-locators). Replicas elect a leader with a "
        "Lease; only the leader writes.",
    )
    controller.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="this kubeconfig (default: in-cluster, else ~/.kube/config)",
    )
    controller.add_argument(
        "--namespace",
        required=True,
        metavar="NS",
        help="where node locators and the Lease live (in a pod: $(POD_NAMESPACE))",
    )
    controller.add_argument(
        "--http", required=True, metavar="HOST:PORT", help="serve /health, /ready and /metrics"
    )
    controller.add_argument(
        "--node-label-keys",
        action="append",
        default=[],
        metavar="KEY[,KEY]",
        help=f"copy these node labels too, repeatable (always: {', '.join(DEFAULT_LABEL_KEYS)})",
    )
    controller.add_argument(
        "--node-label-prefixes",
        action="append",
        default=[],
        metavar="PREFIX[,PREFIX]",
        help="copy the node labels whose keys start so, e.g. topology.kubernetes.io/",
    )
    controller.add_argument("--lease-name", default=lease.name, help="default %(default)s")
    controller.add_argument(
        "--lease-duration",
        default=f"{lease.duration:g}s",
        metavar="DURATION",
        help="how long an unrenewed lease holds (default %(default)s)",
    )
    controller.add_argument(
        "--renew-deadline",
        default=f"{lease.renew_deadline:g}s",
        metavar="DURATION",
        help="the leader stops writing when it cannot renew for this long (default %(default)s)",
    )
    controller.add_argument(
        "--retry-period",
        default=f"{lease.retry_period:g}s",
        metavar="DURATION",
        help="how often to try to acquire or renew the lease (default %(default)s)",
    )
    controller.add_argument(
        "--identity",
        default="",
        help="this replica's name in the lease (default: $POD_NAME, else hostname_random)",
    )
    controller.add_argument(
        "--writes-per-second",
        type=float,
        default=50.0,
        metavar="N",
        help="API write rate limit, token bucket (default %(default)g; 0: no limit)",
    )
    add_cidr_options(controller)
    _add_log_options(controller)


def _add_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info"
    )


def _add_answer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--zone",
        action="append",
        default=[],
        metavar="ZONE[,ZONE]",
        help="zones to serve, repeatable (default cluster.local, in-addr.arpa, ip6.arpa)",
    )
    parser.add_argument("--ttl", type=int, default=5, help="TTL of answers (default 5)")
    parser.add_argument(
        "--pods",
        choices=POD_MODES,
        default="disabled",
        help="pod records <a-b-c-d>.<ns>.pod.<zone> (default disabled)",
    )
    parser.add_argument(
        "--endpoint-pod-names",
        action="store_true",
        help="name endpoints without a hostname after their pod",
    )
    parser.add_argument(
        "--namespaces",
        default="",
        metavar="NS[,NS]",
        help="serve only these namespaces (CoreDNS `namespaces`)",
    )
    parser.add_argument(
        "--fallthrough",
        action="append",
        nargs="?",
        const="",
        default=[],
        metavar="ZONE[,ZONE]",
        help="names in these zones that the cluster does not have go to the upstreams instead "
        "of NXDOMAIN (SERVFAIL without upstreams); no zone: every zone (CoreDNS `fallthrough`)",
    )
    parser.add_argument(
        "--autopath",
        action="store_true",
        help="for a pod a PodLocator places in namespace NS, answer X.NS.svc.ZONE, when it does "
        "not exist, with the first name of the pod's search path that does, behind a CNAME "
        "(CoreDNS `autopath @kubernetes`)",
    )
    parser.add_argument(
        "--autopath-resolv-conf",
        type=Path,
        metavar="FILE",
        help="with --autopath: the node's search domains come from this file's `search` line "
        f"(default {DEFAULT_RESOLV_CONF})",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "explain":
        return _explain(args)
    if args.command == "controller":
        return _controller(args)
    return _serve(args)


def _explain(args: argparse.Namespace) -> int:
    from toposdns.explain import explain, parse_question, render_json, render_text
    from toposdns.source.snapshot_file import load_snapshot

    try:
        config = resolver_config(args)
        address, name, qtype = parse_question(args.client, args.name, args.type)
    except (ConfigError, ValueError) as exc:
        print(f"toposdns explain: {exc}", file=sys.stderr)
        return 2
    try:
        snapshot = load_snapshot(args.snapshot)
    except SnapshotError as exc:
        print(f"toposdns explain: {exc}", file=sys.stderr)
        return 1
    result = explain(snapshot, config, address, name, qtype)
    if args.json:
        print(json.dumps(render_json(result), indent=2))
    else:
        print(render_text(result))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from toposdns.kube.client import ConnectError
    from toposdns.serve.loop import LoopError
    from toposdns.server import run, serve
    from toposdns.workers.supervisor import WorkerError

    configure_logging(args.log_level, args.log_format)
    try:
        config = serve_config(args)
    except ConfigError as exc:
        print(f"toposdns serve: {exc}", file=sys.stderr)
        return 2
    try:
        run(serve(config))
    except SnapshotError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except ConnectError as exc:
        log.error("cannot start: %s; or serve from a file with --snapshot FILE", exc)
        return 1
    except LoopError as exc:
        log.error("%s", exc)
        return 1
    except WorkerError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except OSError as exc:
        # The HTTP addresses name themselves; an error without a name is the DNS port's.
        log.error("cannot listen on %s: %s", exc.filename or args.listen, exc.strerror or exc)
        return 1
    return 0


def _controller(args: argparse.Namespace) -> int:
    from toposdns.controller.app import run_controller
    from toposdns.controller.config import controller_config
    from toposdns.kube.client import ConnectError
    from toposdns.server import run

    configure_logging(args.log_level, args.log_format)
    try:
        config = controller_config(args)
    except ConfigError as exc:
        print(f"toposdns controller: {exc}", file=sys.stderr)
        return 2
    try:
        run(run_controller(config))
    except ConnectError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except OSError as exc:
        log.error("cannot serve HTTP on %s: %s", args.http, exc)
        return 1
    return 0
