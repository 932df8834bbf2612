"""The PodLocator controller: one locator per running pod and per node, leader-elected.

Layers, each usable alone:

- `desired`: pure functions from a Pod and its Node (raw objects) to the locator they need;
- `state`: the caches the reflectors fill (slim pods, nodes, locators) and what to reconcile
  when they change;
- `queue`: a de-duplicating, delaying work queue of locator keys, and a token bucket;
- `writer`: compares desired and actual locators and writes the difference, with retries;
- `elector`: leader election with a coordination.k8s.io/v1 Lease (client-go's semantics);
- `app`: the controller assembled, with its HTTP endpoints and signal handling.
"""
