"""Prometheus metrics, each defined once here; `/metrics` serves them (serve/http.py).

Per-query metrics are counted apart, in serve/query_metrics.py and serve/topology_metrics.py,
and registered in `ANSWERING` while a server answers.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

#: What a process that answers DNS counts: the metrics below defined with `registry=ANSWERING`,
#: and each DNS server's per-query counts (registered while it serves). A single process serves
#: it with the rest (it is part of the default registry); with `--workers N`, each worker sends
#: it whole and /metrics sums the workers'. The supervisor never answers, so its copies (and
#: those a worker inherits) stay empty.
ANSWERING = CollectorRegistry(auto_describe=True)

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
    registry=ANSWERING,
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
    registry=ANSWERING,
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
    registry=ANSWERING,
)
PROXY_HEALTHCHECK_FAILURES = Counter(
    "coredns_proxy_healthcheck_failures",
    "Failed requests or health checks to an upstream.",
    ["proxy_name", "to"],
    registry=ANSWERING,
)
FORWARD_HEALTHCHECK_BROKEN = Counter(
    "coredns_forward_healthcheck_broken",
    "Times every upstream was unhealthy at once.",
    registry=ANSWERING,
)
FORWARD_MAX_CONCURRENT_REJECTS = Counter(
    "coredns_forward_max_concurrent_rejects",
    "Queries refused because --max-concurrent forwarded queries were in flight.",
    registry=ANSWERING,
)
UPSTREAM_ERRORS = Counter(
    "toposdns_forward_upstream_errors",
    "Failed exchanges with an upstream, by upstream, transport and reason (timeout, refused, "
    "closed, network, short, wrong_id, not_response, malformed, wrong_question).",
    ["to", "proto", "reason"],
    registry=ANSWERING,
)
FORWARD_LOOPS = Counter(
    "toposdns_forward_loops",
    "Queries this server sent upstream that came back to it, by upstream.",
    ["to"],
    registry=ANSWERING,
)
AUTOPATH_SUCCESS = Counter(
    "coredns_autopath_success",
    "Queries answered by walking the client's search path (--autopath); unlike CoreDNS's, "
    "names that exist as asked are not counted.",
    ["server"],
    registry=ANSWERING,
)
ACL_BLOCKED = Counter(
    "coredns_acl_blocked_requests",
    "Counter of DNS requests being blocked.",
    ["server", "zone", "view"],
    registry=ANSWERING,
)
ACL_FILTERED = Counter(
    "coredns_acl_filtered_requests",
    "Counter of DNS requests being filtered.",
    ["server", "zone", "view"],
    registry=ANSWERING,
)
ACL_DROPPED = Counter(
    "coredns_acl_dropped_requests",
    "Counter of DNS requests being dropped.",
    ["server", "zone", "view"],
    registry=ANSWERING,
)
# CoreDNS's `hosts` (serve/hosts.py), as its metrics.go defines them.
HOSTS_ENTRIES = Gauge(
    "coredns_hosts_entries",
    "The combined number of entries in hosts and Corefile.",
    ["hostsfile"],
    registry=ANSWERING,
)
HOSTS_RELOAD_TIMESTAMP = Gauge(
    "coredns_hosts_reload_timestamp_seconds",
    "The timestamp of the last reload of hosts file (the file's modification time, as CoreDNS's).",
    registry=ANSWERING,
)
#: Gauges each worker sets alike, from the same file: /metrics shows their largest value rather
#: than their sum (workers/exposition.py).
UNSUMMED = frozenset({"coredns_hosts_entries", "coredns_hosts_reload_timestamp_seconds"})
# CoreDNS's `template` (serve/template.py), as its metrics.go defines them.
TEMPLATE_MATCHES = Counter(
    "coredns_template_matches",
    "Counter of template regex matches.",
    ["server", "zone", "view", "class", "type"],
    registry=ANSWERING,
)
TEMPLATE_FAILURES = Counter(
    "coredns_template_template_failures",
    "Counter of go template failures.",
    ["server", "zone", "view", "class", "type", "section", "template"],
    registry=ANSWERING,
)
TEMPLATE_RR_FAILURES = Counter(
    "coredns_template_rr_failures",
    "Counter of mis-templated RRs.",
    ["server", "zone", "view", "class", "type", "section", "template"],
    registry=ANSWERING,
)
REGISTRY.register(ANSWERING)

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
