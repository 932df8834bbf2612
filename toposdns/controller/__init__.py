"""The PodLocator controller: one locator per running pod and per node, leader-elected.

Layers, each usable alone:

- `desired`: pure functions from a Pod and its Node (raw objects) to the locator they need;
- `state`: the caches the reflectors fill (slim pods, nodes, locators) and what to reconcile
  when they change;
- `reconcile`: the one write (create, update, delete or none) from the actual locator to the
  desired one, a pure function;
- `queue`: a de-duplicating, delaying work queue of locator keys, and a token bucket;
- `writer`: makes the planned write through the API, with retries;
- `elector`: leader election with a coordination.k8s.io/v1 Lease (client-go's semantics);
- `config`: the controller's settings, validated from the command line;
- `app`: the controller assembled, with its HTTP endpoints and signal handling.
"""
