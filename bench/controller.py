"""Measure the PodLocator controller on a large cluster served by the stand-in API server.

The cluster (`--layout`): 5,000 Nodes and 150,000 running Pods, 30 per node, one of them
hostNetwork (the node's address),

- `spec`: each node has `spec.podCIDRs` (a /24) and its pods' addresses lie inside it, but for
  one pod in 2,000, whose address is outside every range (a secondary pool);
- `calico`: no `spec.podCIDRs`; each node has two /26 IPAM blocks, shuffled over 10.64.0.0/12,
  and 5% of the pods have an address borrowed from another node's block.

Phases, against `python -m toposdns controller` with the given `--controller-arg`s:

1. cold start, no PodLocator yet: time, from the process start, to /ready 200, the first
   locator and the last; the write requests (POST/PUT/DELETE on podlocators) in the stand-in's
   request log; then every pod address and node address is placed as the DNS server places
   (an exact address, else the longest prefix, claimed once) over the locators written, and
   must land on its own node (`misplaced`);
2. one node's zone label changes: time until every locator on that node carries the new zone;
   the writes;
3. a status-only update of every node (heartbeat, condition, images): the writes (expected 0);
4. a rollout: 10% of the pods deleted and as many created (new names, new addresses inside
   their nodes' ranges, none borrowed): the writes, and placement checked again;
5. SIGTERM (exit code, lease released), then a restart: time until every key has been
   reconciled again, and the writes (expected 0).

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
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
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
from toposdns.store.builder import build_snapshot
from toposdns.store.convert import convert_object

NAMESPACE = "toposdns"
ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
REGION = "region-1"
POLL = 0.05
STOP_TIMEOUT = 10.0
WRITES = ("POST", "PUT", "DELETE")
#: The controller's log lines that tell where a cold start's time went.
MILESTONE = re.compile(r"listed \d+|leading|stopped leading|writing node locators|reconcil")
RECONCILED_LINE = re.compile(r"every locator reconciled in ([\d.]+)s: (\d+) created")
#: One pod in this many has an address outside every node's range (`spec` layout).
OUTSIDE_EVERY = 2000
#: The share of pods on a borrowed address (`calico` layout).
BORROWED_SHARE = 0.05
CALICO_POOL = ipaddress.IPv4Network("10.64.0.0/12")
BLOCK = 64

JSON = dict[str, Any]


# --------------------------------------------------------------------------- the cluster


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_node(i: int, rng: random.Random, cidr: str | None) -> JSON:
    """A node as a kubelet registers it (labels, addresses, conditions, capacity, images), with
    the pod range the node IPAM controller gave it (`cidr`), if any."""
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
        "spec": {
            **({"podCIDR": cidr, "podCIDRs": [cidr]} if cidr else {}),
            "providerID": f"aws:///{name}",
        },
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


def make_pod(i: int, ns: str, node: JSON, ip: str | None, rng: random.Random) -> JSON:
    """A running pod of a Deployment, about 1.9 KB of JSON as the API server returns it; on
    the host's network when `ip` is None."""
    app = f"app-{i // 10:05d}"
    name = f"{app}-7d9f8b6c5d-{_uid(rng)[:5]}"
    host_ip = node["status"]["addresses"][0]["address"]
    ip = ip or host_ip
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
            **({"hostNetwork": True} if ip == host_ip else {}),
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


class Cluster:
    """The nodes and pods of a layout, and each node's free pod addresses (for a rollout)."""

    def __init__(self, layout: str, n_nodes: int, n_pods: int, n_namespaces: int, seed: int):
        self.rng = random.Random(seed)
        self.layout = layout
        self.n_namespaces = n_namespaces
        #: Each node's pod addresses (as integers) not in use.
        self.free: list[list[int]] = []
        self.nodes: list[JSON] = []
        #: The node whose range (`spec`) or block (`calico`) holds an address, by its network.
        self.owner: dict[int, int] = {}
        blocks = self.rng.sample(range(CALICO_POOL.num_addresses // BLOCK), 2 * n_nodes)
        for i in range(n_nodes):
            if layout == "spec":
                cidr = ipaddress.IPv4Network(f"10.{128 + i // 256}.{i % 256}.0/24")
                self.free.append([int(a) for a in cidr.hosts()][1:])  # .1 is the gateway
                self.owner[int(cidr.network_address)] = i
                self.nodes.append(make_node(i, self.rng, str(cidr)))
            else:
                own = [
                    int(CALICO_POOL.network_address) + b * BLOCK for b in blocks[2 * i : 2 * i + 2]
                ]
                self.free.append([start + k for start in own for k in range(BLOCK)])
                self.owner.update(dict.fromkeys(own, i))
                self.nodes.append(make_node(i, self.rng, None))
        for free in self.free:
            self.rng.shuffle(free)
        self.pods: list[JSON] = []
        self.borrowed = self.outside = 0
        for i in range(n_pods):
            node = i % n_nodes
            host = i // n_nodes == 0  # the first pod of each node: a DaemonSet's, hostNetwork
            self.pods.append(self.new_pod(i, node, host, mixed=True))

    def new_pod(self, i: int, node: int, host: bool = False, mixed: bool = False) -> JSON:
        """Pod number `i` on node number `node`; with `mixed`, a share of them outside their
        node's range (`spec`) or on a borrowed address (`calico`)."""
        ip: str | None = None
        if not host:
            free = self.free[node]
            if mixed and self.layout == "spec" and i % OUTSIDE_EVERY == OUTSIDE_EVERY - 1:
                ip = str(ipaddress.IPv4Address("100.64.0.0") + self.outside)
                self.outside += 1
            else:
                if mixed and self.layout == "calico" and self.rng.random() < BORROWED_SHARE:
                    free = self.free[self.rng.randrange(len(self.free))]
                    self.borrowed += free is not self.free[node]
                ip = str(ipaddress.IPv4Address(free.pop()))
        ns = f"ns-{i % self.n_namespaces:02d}"
        return make_pod(i, ns, self.nodes[node], ip, self.rng)

    def release(self, pod: JSON) -> None:
        """The pod is gone: its address is free again, in the range or block it came from."""
        if pod["spec"].get("hostNetwork"):
            return
        value = int(ipaddress.IPv4Address(pod["status"]["podIP"]))
        size = 256 if self.layout == "spec" else BLOCK
        node = self.owner.get(value // size * size)
        if node is not None:
            self.free[node].insert(0, value)  # taken last, as IPAMs prefer unused addresses


# --------------------------------------------------------------------------- the controller


class Controller(ServerProcess):
    """`toposdns controller` against the stand-in, its probes on `http_port`."""

    def queue_depth(self) -> float | None:
        """toposdns_controller_queue_depth from /metrics (None: no answer)."""
        try:
            url = f"http://{HOST}:{self.http_port}/metrics"
            with urllib.request.urlopen(url, timeout=5.0) as reply:
                text = reply.read().decode()
        except OSError:
            return None
        found = re.search(r"^toposdns_controller_queue_depth ([\d.e+]+)$", text, re.M)
        return float(found[1]) if found else None

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


def placer(locators: Iterable[JSON]) -> Callable[[str], str | None]:
    """Where the DNS server places addresses given these locators: the server's own placement
    (`Snapshot.place`: an exact `addresses` match first, else the longest `cidrs` prefix that
    holds the address, claimed by one locator only) over a snapshot of them. Returns a function
    from an address to its node name (None: unplaced)."""
    snapshot = build_snapshot([convert_object(loc) for loc in locators], serial=1)

    def place(address: str) -> str | None:
        locator = snapshot.place(address).locator
        return locator.node_name if locator is not None else None

    return place


def misplaced(server: FakeApiServer) -> int:
    """How many pod and node addresses the written locators do not place on their own node."""
    place = placer(server.objects("podlocators"))
    wrong = 0
    for pod in server.objects("pods"):
        for entry in pod["status"]["podIPs"]:
            wrong += place(entry["ip"]) != pod["spec"]["nodeName"]
    for node in server.objects("nodes"):
        for entry in node["status"]["addresses"]:
            if entry["type"] == "InternalIP":
                wrong += place(entry["address"]) != node["metadata"]["name"]
    return wrong


def locator_counts(server: FakeApiServer) -> dict[str, int]:
    """PodLocators stored, node and pod ones."""
    locators = server.objects("podlocators")
    nodes = sum("toposdns.io/locator" in loc["metadata"]["labels"] for loc in locators)
    return {"node": nodes, "pod": len(locators) - nodes}


def run(args: argparse.Namespace) -> JSON:
    result: JSON = {
        **machine(),
        "layout": args.layout,
        "nodes": args.nodes,
        "pods": args.pods,
        "writes_per_second": args.writes_per_second,
        "controller_args": args.controller_arg,
    }
    log(f"generating {args.nodes:,} nodes and {args.pods:,} pods ({args.layout})")
    cluster = Cluster(args.layout, args.nodes, args.pods, args.namespaces, args.seed)
    nodes, pods = cluster.nodes, cluster.pods
    result["borrowed"], result["outside"] = cluster.borrowed, cluster.outside
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
        result["cold"]["locators"] = locator_counts(server)
        result["cold"]["misplaced"] = misplaced(server)
        log(f"cold start: {result['cold']['locators']}, {result['cold']['misplaced']} misplaced")
        result["label_change"] = label_change(server, proc, nodes, args)
        result["status_churn"] = status_churn(server, proc, nodes, args)
        result["rollout"] = rollout(server, proc, cluster, args)
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
    """1. From the process start: /ready, the first locator, every key reconciled (the
    controller's log line: its queue ran empty). `own_cpu`: this process's CPU seconds just
    before the controller started."""
    deadline = proc.started + args.timeout
    ready_at = first_at = None
    while (reconciled := proc.find(RECONCILED_LINE)) is None:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"{server.count('podlocators'):,} locators after {args.timeout:.0f} s:\n"
                f"{proc.tail()}"
            )
        proc.check_alive()
        if first_at is None and server.count("podlocators"):
            first_at = now - proc.started
        if ready_at is None and proc.ready():
            ready_at = time.monotonic() - proc.started
        time.sleep(POLL)
    writes = count_writes(server)
    hwm, rss = proc.memory()
    cpu = proc.cpu_seconds()
    standin_cpu = self_cpu_seconds() - own_cpu
    log(f"every key reconciled after {reconciled[0]:.1f} s; settling")
    time.sleep(args.settle)
    result = {
        "ready_s": ready_at,
        "first_write_s": first_at,
        "all_written_s": reconciled[0],
        "controller_reconciled_s": float(reconciled[1][1]),
        "writes": writes,
        "writes_after_settling": count_writes(server),
        "controller_cpu_s": cpu,
        "standin_cpu_s": standin_cpu,
        "vmhwm_mb": hwm,
        "vmrss_mb": rss,
        "milestones": [
            f"{at:.1f} s {line.split(' ', 3)[-1]}"
            for at, line in proc.lines
            if MILESTONE.search(line)
        ],
    }
    log(f"cold start: {result}")
    return result


def label_change(
    server: FakeApiServer, proc: Controller, nodes: list[JSON], args: argparse.Namespace
) -> JSON:
    """2. One node's zone changes: time until all its locators carry it, and the writes."""
    node = copy.deepcopy(server.get("nodes", None, nodes[len(nodes) // 2]["metadata"]["name"]))
    assert node is not None
    name = node["metadata"]["name"]
    keys = [
        (loc["metadata"]["namespace"], loc["metadata"]["name"])
        for loc in server.objects("podlocators")
        if loc["nodeName"] == name
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


def rollout(
    server: FakeApiServer, proc: Controller, cluster: Cluster, args: argparse.Namespace
) -> JSON:
    """4. A tenth of the pods replaced by new ones (new names, free addresses in their nodes'
    ranges, on random nodes; a freed address is taken again last): the writes, counted until a
    marker pod created last (on a borrowed address, so it needs a locator) has its locator and
    the controller's queue has stayed empty for a second, plus a settle period."""
    mark = len(server.requests)
    rng = random.Random(args.seed + 1)
    gone = rng.sample(range(len(cluster.pods)), len(cluster.pods) // 10)
    start = time.perf_counter()
    for i in gone:
        old = cluster.pods[i]
        server.delete("pods", old["metadata"]["namespace"], old["metadata"]["name"])
        cluster.release(old)
    for n, i in enumerate(gone):
        node = rng.randrange(len(cluster.nodes))
        cluster.pods[i] = cluster.new_pod(len(cluster.pods) + n, node)
        server.add(cluster.pods[i])
    lent = str(ipaddress.IPv4Address(cluster.free[1][-1]))  # node 1's: a borrowed address
    marker = make_pod(0, "bench", cluster.nodes[0], lent, cluster.rng)
    server.add(marker)
    events_s = time.perf_counter() - start
    deadline = time.monotonic() + args.event_timeout
    while server.get("podlocators", NAMESPACE, f"bench.{marker['metadata']['name']}") is None:
        proc.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the rollout's marker has no locator:\n{proc.tail()}")
        time.sleep(POLL)
    # Then until the queue has stayed empty for a second (the writes the events call for).
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        quiet = quiet + 1 if proc.queue_depth() == 0 else 0
        time.sleep(0.5)
    time.sleep(args.settle)
    writes = count_writes(server, mark)
    writes["POST"] -= 1  # the marker's
    server.delete("pods", "bench", marker["metadata"]["name"])
    result = {
        "replaced": len(gone),
        "events_s": events_s,
        "writes": writes,
        "misplaced": misplaced(server),
    }
    log(f"rollout: {result}")
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
    """5. After a restart every locator is reconciled again, and all are right already;
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


def _writes(w: dict[str, int]) -> str:
    return f"{w['POST']:,} POST, {w['PUT']:,} PUT, {w['DELETE']:,} DELETE, {w['GET']:,} GET"


def table(r: JSON) -> str:
    c, lc, sc, ro, rs = (
        r[k] for k in ("cold", "label_change", "status_churn", "rollout", "restart")
    )
    cw, lw, sw, rw = c["writes"], lc["writes"], sc["writes"], rs["writes"]
    mixed = (
        f"{r['outside']:,} pods outside every range"
        if r["layout"] == "spec"
        else f"{r['borrowed']:,} pods on borrowed addresses"
    )
    rows = [
        ("date / machine", f"{r['date']}, nproc {r['nproc']}, {r['cpu']}, Python {r['python']}"),
        (
            "cluster",
            f"{r['layout']} layout: {r['nodes']:,} nodes, {r['pods']:,} pods ({mixed}; "
            f"{r['object_bytes']['pod']} B / pod, {r['object_bytes']['node']} B / node as JSON)",
        ),
        (
            "controller",
            " ".join([f"--writes-per-second {r['writes_per_second']:g}", *r["controller_args"]]),
        ),
        ("cold: /ready 200", f"{c['ready_s']:.1f} s after process start"),
        ("cold: first locator", f"{c['first_write_s']:.1f} s"),
        (
            "cold: every key reconciled",
            f"{c['all_written_s']:.1f} s after process start ({c['controller_reconciled_s']} s "
            "from leading+synced to an empty queue)",
        ),
        (
            "cold: locators written",
            f"{c['locators']['node']:,} node + {c['locators']['pod']:,} pod; requests: "
            f"{_writes(cw)} (after settling: {_writes(c['writes_after_settling'])})",
        ),
        ("cold: addresses misplaced", f"{c['misplaced']}"),
        ("cold: controller log", "; ".join(c["milestones"])),
        (
            "cold: controller",
            f"CPU {c['controller_cpu_s']:.0f} s (stand-in: {c['standin_cpu_s']:.0f} s), "
            f"VmHWM {c['vmhwm_mb']:.0f} MB, VmRSS {c['vmrss_mb']:.0f} MB "
            f"(at the end: {c['vmrss_end_mb']:.0f} MB)",
        ),
        (
            "label change: all updated",
            f"{lc['seconds'] * 1000:.0f} ms ({lc['locators_on_node']} locators on "
            f"{lc['node']}); {_writes(lw)}",
        ),
        (
            "status churn: requests",
            f"{sw['PUT'] + sw['POST'] + sw['DELETE']} writes after {sc['node_updates']:,} node "
            f"status updates ({sc['settle_s']:g} s settle)",
        ),
        (
            "rollout",
            f"{ro['replaced']:,} pods replaced: {_writes(ro['writes'])}; "
            f"{ro['misplaced']} addresses misplaced after",
        ),
        ("SIGTERM", f"exit {r['exit_code']}, lease released: {r['lease_released']}"),
        (
            "restart: every key reconciled",
            f"{rs['reconciled_s']:.1f} s after process start; {_writes(rw)}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--pods", type=int, default=150_000)
    p.add_argument(
        "--layout",
        choices=("spec", "calico"),
        default="spec",
        help="spec: node podCIDRs; calico: two /26 IPAM blocks per node, 5%% borrowed addresses",
    )
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument(
        "--writes-per-second",
        type=float,
        default=50.0,
        help="the controller's rate limit (default %(default)g, the controller's own default)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the cold start")
    p.add_argument(
        "--event-timeout", type=float, default=120.0, help="seconds for a label change or rollout"
    )
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
