"""Measure the PodLocator controller on a large cluster served by the stand-in API server.

Four phases:

1. cold start: 5,000 Nodes and 100,000 running Pods in the API and no PodLocator; start
   `python -m toposdns controller` and time, from the process start: /ready 200, the first
   locator written, and all 105,000 locators written (100,000 pod + 5,000 node locators);
   count the write requests (POST/PUT/DELETE on podlocators) in the stand-in's request log;
   then check every locator against `desired()` / `node_locator()`;
2. one node's zone label changes: time until every locator on that node (its pods' and its
   node locator) carries the new zone; writes counted (expected: pods on the node + 1);
3. a status-only update of every node (heartbeat, condition, images): writes counted over a
   settle period (expected: 0);
4. SIGTERM (exit code, lease released), then a restart: time until every key has been
   reconciled again, and the writes that took (expected: 0, all locators are right).

The API is the test suite's stand-in (`FakeApiServer`), in a thread of this process (it owns one
core of the two this was measured on; the controller the other).

Run from the repository root:  python -m bench.controller  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import random
import re
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import (
    HOST,
    FakeApiServer,
    ServerProcess,
    free_port,
    log,
    machine,
    toposdns_command,
)
from bench.live_server import ready
from toposdns.controller.config import ControllerConfig
from toposdns.controller.desired import content_of, desired, node_locator

NAMESPACE = "toposdns"
ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
REGION = "region-1"
POLL = 0.05
STOP_TIMEOUT = 10.0
WRITES = ("POST", "PUT", "DELETE")
RECONCILED_LINE = re.compile(r"every locator reconciled in ([\d.]+)s: (\d+) created")

JSON = dict[str, Any]


# --------------------------------------------------------------------------- the cluster


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_node(i: int, rng: random.Random) -> JSON:
    """A node as a kubelet registers it (labels, addresses, conditions, capacity, images)."""
    name = f"node-{i:05d}"
    ip = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("172.16.0.10")) + i))
    conditions = [
        {
            "type": t,
            "status": "False" if t != "Ready" else "True",
            "lastHeartbeatTime": "2026-11-22T00:00:00Z",
            "lastTransitionTime": "2026-11-01T00:00:00Z",
            "reason": f"Kubelet{t}",
            "message": f"kubelet reports {t}",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid(rng),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m5.xlarge",
                ZONE: ZONES[i % len(ZONES)],
                "topology.kubernetes.io/region": REGION,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": f"10.{128 + i // 256}.{i % 256}.0/24", "providerID": f"aws:///{name}"},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3920m", "memory": "15Gi", "pods": "110"},
            "conditions": conditions,
            "nodeInfo": {
                "kubeletVersion": "v1.37.0",
                "containerRuntimeVersion": "containerd://2.1.0",
                "osImage": "Ubuntu 24.04 LTS",
                "kernelVersion": "6.8.0",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": [
                {"names": [f"registry.example.com/app-{k}:1.{k}"], "sizeBytes": 10_000_000 + k}
                for k in range(5)
            ],
        },
    }


def make_pod(i: int, ns: str, node: JSON, rng: random.Random) -> JSON:
    """A running pod of a Deployment, about 1.7 KB of JSON as the API server returns it."""
    app = f"app-{i // 10:05d}"
    name = f"{app}-7d9f8b6c5d-{_uid(rng)[:5]}"
    ip = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.128.0.1")) + i))
    host_ip = node["status"]["addresses"][0]["address"]
    started = "2026-11-22T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": _uid(rng),
            "labels": {"app.kubernetes.io/name": app, "pod-template-hash": "7d9f8b6c5d"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d9f8b6c5d",
                    "uid": _uid(rng),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node["metadata"]["name"],
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example.com/{app}:1.2.3",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": started}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
            ],
            "containerStatuses": [
                {
                    "name": "app",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": f"registry.example.com/{app}:1.2.3",
                    "imageID": f"registry.example.com/{app}@sha256:{'0' * 64}",
                    "containerID": f"containerd://{rng.getrandbits(256):064x}",
                    "state": {"running": {"startedAt": started}},
                }
            ],
        },
    }


def generate(
    n_nodes: int, n_pods: int, n_namespaces: int, seed: int
) -> tuple[list[JSON], list[JSON]]:
    """Nodes, and pods spread round-robin over them (pods / nodes per node) and namespaces."""
    rng = random.Random(seed)
    nodes = [make_node(i, rng) for i in range(n_nodes)]
    pods = [
        make_pod(i, f"ns-{i % n_namespaces:02d}", nodes[i % n_nodes], rng) for i in range(n_pods)
    ]
    return nodes, pods


# --------------------------------------------------------------------------- the controller


class Controller(ServerProcess):
    """`toposdns controller` against the stand-in, its probes on `http_port`."""

    def __init__(self, kubeconfig: Path, extra: Sequence[str]) -> None:
        self.http_port = free_port()
        super().__init__(
            toposdns_command("controller", f"--kubeconfig={kubeconfig}",
                             f"--namespace={NAMESPACE}", f"--http={HOST}:{self.http_port}", *extra)
        )  # fmt: skip

    def ready(self) -> bool:
        return ready(self.http_port)


# --------------------------------------------------------------------------- measuring


def mean_json_bytes(objs: Sequence[JSON]) -> int:
    """The mean size of the objects as compact JSON."""
    return round(sum(len(json.dumps(o, separators=(",", ":"))) for o in objs) / len(objs))


def count_writes(server: FakeApiServer, since: int = 0) -> dict[str, int]:
    counts = {"POST": 0, "PUT": 0, "DELETE": 0, "GET": 0}
    for r in server.requests[since:]:
        if r.resource == "podlocators" and not r.is_watch and r.path.count("/") > 5:
            if r.method in counts:
                counts[r.method] += 1
    return counts


def verify(
    server: FakeApiServer, nodes: list[JSON], pods: list[JSON], config: ControllerConfig
) -> int:
    """How many locators differ from what the pods and nodes call for (0 when all are right)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    wrong = 0
    for pod in pods:
        meta = pod["metadata"]
        stored = server.get("podlocators", meta["namespace"], meta["name"])
        current = server.get("pods", meta["namespace"], meta["name"]) or pod
        want = desired(current, by_name[pod["spec"]["nodeName"]], config)
        wrong += stored is None or want is None or content_of(stored) != content_of(want)
    for node in nodes:
        stored = server.get("podlocators", NAMESPACE, node["metadata"]["name"])
        want = node_locator(server.get("nodes", None, node["metadata"]["name"]) or node, config)
        wrong += stored is None or want is None or content_of(stored) != content_of(want)
    return wrong


def run(args: argparse.Namespace) -> JSON:
    result: JSON = {
        **machine(),
        "nodes": args.nodes,
        "pods": args.pods,
        "writes_per_second": args.writes_per_second,
    }
    log(f"generating {args.nodes:,} nodes and {args.pods:,} pods")
    nodes, pods = generate(args.nodes, args.pods, args.namespaces, args.seed)
    sizes = {"pod": mean_json_bytes(pods[:1000]), "node": mean_json_bytes(nodes[:100])}
    result["object_bytes"] = sizes
    server = FakeApiServer(leases=True)
    proc: Controller | None = None
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-controller-bench-"))
    try:
        start = time.perf_counter()
        for obj in (*nodes, *pods):
            server.add(obj)
        server.compact()  # drop the load's history: nothing watches it
        server.start()
        log(f"stand-in loaded in {time.perf_counter() - start:.1f} s")
        kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
        extra = [f"--writes-per-second={args.writes_per_second}", *args.controller_arg]
        own_cpu = self_cpu_seconds()
        proc = Controller(kubeconfig, extra)
        result["cold"] = cold_start(server, proc, own_cpu, args)
        result["cold"]["wrong_locators"] = verify(
            server, nodes, pods, ControllerConfig(namespace=NAMESPACE)
        )
        log(f"verified: {result['cold']['wrong_locators']} locators wrong")
        result["label_change"] = label_change(server, proc, nodes, pods, args)
        result["status_churn"] = status_churn(server, proc, nodes, args)
        result["cold"]["vmhwm_end_mb"], result["cold"]["vmrss_end_mb"] = proc.memory()
        result["exit_code"] = proc.stop(STOP_TIMEOUT)
        lease = server.get("leases", NAMESPACE, "toposdns-controller")
        result["lease_released"] = bool(lease and lease["spec"].get("holderIdentity") == "")
        mark = len(server.requests)
        proc = Controller(kubeconfig, extra)
        result["restart"] = restart(server, proc, mark, args)
        return result
    finally:
        if proc is not None:
            proc.stop(STOP_TIMEOUT)
            if args.show_log:
                log("controller log:\n" + proc.tail(30))
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def self_cpu_seconds() -> float:
    """CPU seconds of this process so far (the stand-in's threads run here)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cold_start(
    server: FakeApiServer, proc: Controller, own_cpu: float, args: argparse.Namespace
) -> JSON:
    """1. From the process start: /ready, the first locator, all locators; then settle.
    `own_cpu`: this process's CPU seconds just before the controller started."""
    expected = args.pods + args.nodes
    deadline = proc.started + args.timeout
    ready_at = first_at = None
    while True:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"{server.count('podlocators'):,} of {expected:,} locators after "
                f"{args.timeout:.0f} s:\n{proc.tail()}"
            )
        proc.check_alive()
        count = server.count("podlocators")
        if first_at is None and count:
            first_at = now - proc.started
        if ready_at is None and proc.ready():
            ready_at = time.monotonic() - proc.started
        if count >= expected and ready_at is not None:
            all_at = now - proc.started
            break
        time.sleep(POLL)
    cold = count_writes(server)
    hwm, rss = proc.memory()
    cpu = proc.cpu_seconds()
    standin_cpu = self_cpu_seconds() - own_cpu
    log(f"all {expected:,} locators after {all_at:.1f} s; settling")
    settle_end = time.monotonic() + 60
    while proc.find(RECONCILED_LINE) is None and time.monotonic() < settle_end:
        time.sleep(POLL)
    time.sleep(1.0)
    reconciled = proc.find(RECONCILED_LINE)
    result = {
        "ready_s": ready_at,
        "first_write_s": first_at,
        "all_written_s": all_at,
        "controller_reconciled_s": float(reconciled[1][1]) if reconciled else None,
        "writes": cold,
        "writes_after_settling": count_writes(server),
        "controller_cpu_s": cpu,
        "standin_cpu_s": standin_cpu,
        "vmhwm_mb": hwm,
        "vmrss_mb": rss,
    }
    log(f"cold start: {result}")
    return result


def label_change(
    server: FakeApiServer,
    proc: Controller,
    nodes: list[JSON],
    pods: list[JSON],
    args: argparse.Namespace,
) -> JSON:
    """2. One node's zone changes: time until all its locators carry it, and the writes."""
    node = copy.deepcopy(server.get("nodes", None, nodes[len(nodes) // 2]["metadata"]["name"]))
    assert node is not None
    name = node["metadata"]["name"]
    keys = [(NAMESPACE, name)] + [
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in pods
        if p["spec"]["nodeName"] == name
    ]
    mark = len(server.requests)
    node["metadata"]["labels"][ZONE] = "zone-moved"
    changed_at = time.monotonic()
    server.modify(node)
    pending = set(keys)
    while pending:
        if time.monotonic() - changed_at > args.event_timeout:
            raise TimeoutError(f"{len(pending)} locators of {name} not updated:\n{proc.tail()}")
        for key in list(pending):
            found = server.get("podlocators", *key)
            if found and found["nodeLabels"].get(ZONE) == "zone-moved":
                pending.discard(key)
        time.sleep(0.001)
    took = time.monotonic() - changed_at
    time.sleep(args.settle)
    result = {
        "node": name,
        "locators_on_node": len(keys),
        "seconds": took,
        "writes": count_writes(server, mark),
    }
    log(f"label change: {result}")
    return result


def status_churn(
    server: FakeApiServer, proc: Controller, nodes: list[JSON], args: argparse.Namespace
) -> JSON:
    """3. Every node's status changes (heartbeats): nothing to write."""
    mark = len(server.requests)
    start = time.perf_counter()
    for original in nodes:
        current = server.get("nodes", None, original["metadata"]["name"])
        assert current is not None
        for condition in current["status"]["conditions"]:
            condition["lastHeartbeatTime"] = "2026-11-22T00:00:10Z"
        current["status"]["images"] = current["status"]["images"][::-1]
        server.modify(current)
    churn_s = time.perf_counter() - start
    time.sleep(args.settle)
    proc.check_alive()
    result = {
        "node_updates": len(nodes),
        "update_seconds": churn_s,
        "settle_s": args.settle,
        "writes": count_writes(server, mark),
    }
    log(f"status churn: {result}")
    return result


def restart(server: FakeApiServer, proc: Controller, mark: int, args: argparse.Namespace) -> JSON:
    """4. After a restart every locator is reconciled again, and all are right already;
    `mark`: the request log's length before it started."""
    deadline = proc.started + args.timeout
    while (found := proc.find(RECONCILED_LINE)) is None:
        proc.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no full reconcile after a restart:\n{proc.tail()}")
        time.sleep(POLL)
    time.sleep(args.settle)
    result = {"reconciled_s": found[0], "writes": count_writes(server, mark)}
    log(f"restart: {result}")
    return result


def table(r: JSON) -> str:
    c, lc, sc, rs = r["cold"], r["label_change"], r["status_churn"], r["restart"]
    cw, lw, sw, rw = c["writes"], lc["writes"], sc["writes"], rs["writes"]
    rows = [
        ("date / machine", f"{r['date']}, nproc {r['nproc']}, {r['cpu']}, Python {r['python']}"),
        (
            "cluster",
            f"{r['nodes']:,} nodes, {r['pods']:,} pods ({r['object_bytes']['pod']} B / pod, "
            f"{r['object_bytes']['node']} B / node as JSON); --writes-per-second "
            f"{r['writes_per_second']:g}",
        ),
        ("cold: /ready 200", f"{c['ready_s']:.1f} s after process start"),
        ("cold: first locator", f"{c['first_write_s']:.1f} s"),
        (
            "cold: all locators",
            f"{c['all_written_s']:.1f} s ({r['pods'] + r['nodes']:,}; controller's own count "
            f"from leading+synced to queue empty: {c['controller_reconciled_s']} s)",
        ),
        (
            "cold: requests",
            f"{cw['POST']:,} POST, {cw['PUT']:,} PUT, {cw['DELETE']:,} DELETE, {cw['GET']:,} GET "
            f"(after settling: {c['writes_after_settling']['POST']:,} POST, "
            f"{c['writes_after_settling']['PUT']:,} PUT)",
        ),
        ("cold: wrong locators", f"{c['wrong_locators']}"),
        (
            "cold: controller",
            f"CPU {c['controller_cpu_s']:.0f} s (stand-in: {c['standin_cpu_s']:.0f} s), "
            f"VmHWM {c['vmhwm_mb']:.0f} MB, VmRSS {c['vmrss_mb']:.0f} MB "
            f"(at the end: {c['vmrss_end_mb']:.0f} MB)",
        ),
        (
            "label change: all updated",
            f"{lc['seconds'] * 1000:.0f} ms ({lc['locators_on_node']} locators on {lc['node']})",
        ),
        (
            "label change: requests",
            f"{lw['PUT']} PUT, {lw['POST']} POST, {lw['DELETE']} DELETE, {lw['GET']} GET",
        ),
        (
            "status churn: requests",
            f"{sw['PUT'] + sw['POST'] + sw['DELETE']} writes after {sc['node_updates']:,} node "
            f"status updates ({sc['settle_s']:g} s settle)",
        ),
        ("SIGTERM", f"exit {r['exit_code']}, lease released: {r['lease_released']}"),
        (
            "restart: every key reconciled",
            f"{rs['reconciled_s']:.1f} s after process start; "
            f"{rw['POST'] + rw['PUT'] + rw['DELETE']} writes, {rw['GET']} GET",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--pods", type=int, default=100_000)
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument(
        "--writes-per-second",
        type=float,
        default=0.0,
        help="the controller's rate limit (default 0: none, to measure the controller itself)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the cold start")
    p.add_argument("--event-timeout", type=float, default=60.0, help="seconds for the label change")
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait for stray writes")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print the controller's log at the end")
    p.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `toposdns controller` (repeatable)",
    )
    args = p.parse_args(argv)
    if min(args.nodes, args.pods, args.namespaces) < 1:
        p.error("sizes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
