"""The `toposdns` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toposdns import __version__
from toposdns.config import ANSWER_PLUGINS, PLUGINS, Reading, ServeConfig, answer_options
from toposdns.corefile import read_corefile
from toposdns.logs import configure_logging
from toposdns.options import ConfigError, Plugin
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
        "--corefile",
        type=Path,
        metavar="FILE",
        help="read the settings from this Corefile, as CoreDNS does (`toposdns -conf FILE`); "
        "flags given with it override it",
    )
    add_plugin_flags(serve, PLUGINS)
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
        "--client",
        required=True,
        metavar="IP[/LENGTH]",
        help="the client's address (a pod or node IP), or a Client Subnet prefix as a forwarder "
        "would send it",
    )
    explain.add_argument("--json", action="store_true", help="print JSON for tools")
    explain.add_argument("name", help="the query name, e.g. web.shop.svc.cluster.local")
    explain.add_argument("type", nargs="?", default="A", help="record type (default A)")
    add_plugin_flags(explain, ANSWER_PLUGINS)
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


def add_plugin_flags(parser: argparse.ArgumentParser, plugins: Sequence[Plugin[Any]]) -> None:
    """The flags of the plugins' settings, each with its help line and default."""
    for plugin in plugins:
        for setting in plugin.settings:
            if not setting.flag:
                continue
            text = setting.help.replace("%", "%%")
            if setting.shows:
                text = text.replace("{default}", plugin.default_text(setting.shows))
            kwargs: dict[str, Any] = {"help": text, "dest": _dest(setting.flag), "default": None}
            if not setting.metavar:
                kwargs["action"] = "store_true"
            else:
                kwargs["metavar"] = setting.metavar
                if setting.optional:
                    kwargs.update(nargs="?", const=True)
                if setting.repeat:
                    kwargs["action"] = "append"
            parser.add_argument(setting.flag, **kwargs)


def given_flags(args: argparse.Namespace, plugins: Sequence[Plugin[Any]]) -> dict[str, Any]:
    """The plugin flags given on the command line, by flag."""
    return {
        setting.flag: getattr(args, _dest(setting.flag))
        for plugin in plugins
        for setting in plugin.settings
        if setting.flag
    }


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(coredns_arguments(sys.argv[1:] if argv is None else argv))
    if args.command == "explain":
        return _explain(args)
    if args.command == "controller":
        return _controller(args)
    return _serve(args)


def coredns_arguments(argv: list[str]) -> list[str]:
    """CoreDNS's command line, `-conf FILE` (as its Deployments pass it), as `serve
    --corefile FILE`; any other command line as it is."""
    if argv and (argv[0] == "-conf" or argv[0].startswith("-conf=")):
        name, _, value = argv[0].partition("=")
        return ["serve", "--corefile", *([value] if value else []), *argv[1:]]
    return argv


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """`serve`'s configuration: the Corefile, if given, then the flags."""
    reading = Reading() if args.corefile is None else read_corefile(args.corefile)
    return reading.read_flags(given_flags(args, PLUGINS)).done()


def _explain(args: argparse.Namespace) -> int:
    from toposdns.explain import explain, parse_question, render_json, render_text
    from toposdns.source.snapshot_file import load_snapshot

    try:
        config, autopath, believed = answer_options(given_flags(args, ANSWER_PLUGINS))
        address, name, qtype = parse_question(args.client, args.name, args.type)
    except (ConfigError, ValueError) as exc:
        print(f"toposdns explain: {exc}", file=sys.stderr)
        return 2
    try:
        snapshot = load_snapshot(args.snapshot, locator_namespaces=believed)
    except SnapshotError as exc:
        print(f"toposdns explain: {exc}", file=sys.stderr)
        return 1
    result = explain(snapshot, config, address, name, qtype, autopath)
    if args.json:
        print(json.dumps(render_json(result), indent=2))
    else:
        print(render_text(result))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from toposdns.kube.client import ConnectError
    from toposdns.open_files import fit_open_files
    from toposdns.serve.loop import LoopError
    from toposdns.server import run, serve
    from toposdns.workers.supervisor import WorkerError, supervise

    configure_logging(args.log_level, args.log_format)
    try:
        config = fit_open_files(serve_config(args))
    except ConfigError as exc:
        print(f"toposdns serve: {exc}", file=sys.stderr)
        return 2
    try:
        corefile = (
            None
            if args.corefile is None
            else (args.corefile, lambda: fit_open_files(serve_config(args)))
        )
        run(supervise(config, corefile) if config.workers > 1 else serve(config, corefile))
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
        log.error("cannot listen on %s: %s", exc.filename or config.bind, exc.strerror or exc)
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
