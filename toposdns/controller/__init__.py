"""The PodLocator controller: a locator per node with its pod ranges, and one per running pod
that those do not place; leader-elected.

Layers, each usable alone:

- `desired`: pure functions from a Pod and its Node (raw objects) to the locator they need;
- `cidrs`: node pod ranges, longest-prefix placement, and ranges learnt from pod addresses;
- `state`: the caches the reflectors fill (slim pods, nodes, locators), which pods need a
  locator of their own, and what to reconcile when they change;
- `reconcile`: the one write (create, update, delete or none) from the actual locator to the
  desired one, a pure function;
- `queue`: a de-duplicating, delaying work queue of locator keys, and a token bucket;
- `writer`: makes the planned write through the API, with retries;
- `elector`: leader election with a coordination.k8s.io/v1 Lease (client-go's semantics);
- `config`: the controller's settings, validated from the command line;
- `app`: the controller assembled, with its HTTP endpoints and signal handling.
"""
