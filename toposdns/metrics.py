"""Prometheus metrics, each defined once here; `/metrics` serves them (serve/http.py).

Per-query metrics are counted apart, in serve/query_metrics.py.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# The server itself, as CoreDNS's `prometheus` and `reload` plugins export it.
BUILD_INFO = Gauge(
    "coredns_build_info",
    "A metric with a constant '1' value labeled by version, revision, and goversion from which "
    "the server was built (goversion: the Python runtime here).",
    ["version", "revision", "goversion"],
)
PLUGIN_ENABLED = Gauge(
    "coredns_plugin_enabled",
    "A metric that indicates whether a plugin is enabled on per server and zone basis.",
    ["server", "zone", "view", "name"],
)
PANICS = Counter(
    "coredns_panics",
    "Internal errors while answering a query (each answered SERVFAIL, its traceback logged).",
)
RELOAD_FAILED = Counter("coredns_reload_failed", "Counter of the number of failed reload attempts.")
RELOAD_VERSION = Gauge(
    "coredns_reload_version_info",
    "A metric with a constant '1' value labeled by hash, and value which type of hash generated.",
    ["hash", "value"],
)
DNS_PROGRAMMING_DURATION = Histogram(
    "coredns_kubernetes_dns_programming_duration_seconds",
    "Histogram of the time (in seconds) it took to program a dns instance: from an "
    "EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time to its arrival here.",
    ["service_kind"],
    buckets=[0.001 * 2**k for k in range(20)],  # 1 ms to about 17 minutes, as CoreDNS's
)

INVALID_POLICIES = Counter(
    "toposdns_invalid_topology_policies",
    "Topology policies ignored because they are invalid, counted once per change.",
)
LOCATOR_CONFLICTS = Counter(
    "toposdns_locator_conflicts",
    "Prefixes claimed by two or more PodLocators (nobody inside them is placed), counted once "
    "per change of their claimants.",
)
IGNORED_LOCATORS = Counter(
    "toposdns_ignored_locators",
    "PodLocators ignored because their namespace is not believed (--locator-namespaces), "
    "counted once when each appears.",
)
UNPLACED_SUBNETS = Counter(
    "toposdns_unplaced_client_subnets",
    "Client Subnet prefix lengths shorter than a host that no PodLocator CIDR held whole, "
    "counted once per forwarder and prefix length.",
)
WATCH_RESTARTS = Counter(
    "toposdns_watch_restarts",
    "Watches of the Kubernetes API started again, by resource and reason "
    "(expired: the server ended it; gone: history compacted, relisted; timeout; error).",
    ["resource", "reason"],
)
API_ERRORS = Counter(
    "toposdns_kubernetes_api_errors",
    "Failed list or watch requests to the Kubernetes API, by resource.",
    ["resource"],
)
SOURCE_SYNCED = Gauge(
    "toposdns_source_synced",
    "1 once the data served has synced (every watched resource listed, or the snapshot file "
    "loaded); until then names not found get SERVFAIL and /ready fails.",
)
MALFORMED_OBJECTS = Counter(
    "toposdns_malformed_objects",
    "Kubernetes objects skipped because they cannot be served, by kind.",
    ["kind"],
)

# Forwarding and its cache, under CoreDNS's names so that dashboards carry over.
PROXY_DURATION = Histogram(
    "coredns_proxy_request_duration_seconds",
    "Time each request to an upstream took, by upstream and rcode.",
    ["proxy_name", "to", "rcode"],
    buckets=[0.00025 * 2**k for k in range(16)],
)
PROXY_HEALTHCHECK_FAILURES = Counter(
    "coredns_proxy_healthcheck_failures",
    "Failed requests or health checks to an upstream.",
    ["proxy_name", "to"],
)
FORWARD_HEALTHCHECK_BROKEN = Counter(
    "coredns_forward_healthcheck_broken",
    "Times every upstream was unhealthy at once.",
)
FORWARD_MAX_CONCURRENT_REJECTS = Counter(
    "coredns_forward_max_concurrent_rejects",
    "Queries refused because --max-concurrent forwarded queries were in flight.",
)
UPSTREAM_ERRORS = Counter(
    "toposdns_forward_upstream_errors",
    "Failed exchanges with an upstream, by upstream, transport and reason (timeout, refused, "
    "closed, network, short, wrong_id, not_response, malformed, wrong_question).",
    ["to", "proto", "reason"],
)
FORWARD_LOOPS = Counter(
    "toposdns_forward_loops",
    "Queries this server sent upstream that came back to it, by upstream.",
    ["to"],
)
AUTOPATH_SUCCESS = Counter(
    "coredns_autopath_success",
    "Queries answered by walking the client's search path (--autopath); unlike CoreDNS's, "
    "names that exist as asked are not counted.",
    ["server"],
)
#: What a process that answers DNS counts itself: with `--workers N`, each worker serves these
#: (with its per-query metrics) and /metrics sums them. The supervisor never forwards, so its
#: own copies (and those a worker inherits) stay empty.
ANSWERING = (
    PANICS,
    PROXY_DURATION,
    PROXY_HEALTHCHECK_FAILURES,
    FORWARD_HEALTHCHECK_BROKEN,
    FORWARD_MAX_CONCURRENT_REJECTS,
    UPSTREAM_ERRORS,
    FORWARD_LOOPS,
    AUTOPATH_SUCCESS,
)

# `--workers N`: the supervisor's view of its workers.
WORKER_RESTARTS = Counter(
    "toposdns_worker_restarts", "Worker processes that ended and were started again."
)

# The PodLocator controller (`toposdns controller`).
CONTROLLER_WRITES = Counter(
    "toposdns_controller_writes",
    "Requests the controller made for PodLocators, by verb (get, create, update, delete) and "
    "result (ok, not_found, conflict, throttled, server_error, network, error).",
    ["verb", "result"],
)
CONTROLLER_QUEUE_DEPTH = Gauge(
    "toposdns_controller_queue_depth", "Locator keys waiting to be reconciled."
)
CONTROLLER_LEADER = Gauge(
    "toposdns_controller_leader", "1 while this replica holds the leader Lease (and writes)."
)
CONTROLLER_LEADER_TRANSITIONS = Counter(
    "toposdns_controller_leader_transitions",
    "Times this replica became leader or stopped being leader, by direction (acquired, lost).",
    ["direction"],
)
CONTROLLER_LOCATORS = Gauge(
    "toposdns_controller_locators",
    "PodLocators managed by toposdns that the controller sees, by kind (pod, node).",
    ["kind"],
)
CONTROLLER_POD_LOCATORS = Gauge(
    "toposdns_controller_pod_locators",
    "Pods the leader gives a PodLocator of their own, by reason (all-mode, no-node-cidrs, "
    "outside-node-cidrs, borrowed, node-locator-pending).",
    ["reason"],
)
