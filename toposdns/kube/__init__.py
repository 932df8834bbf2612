"""What toposdns knows of the Kubernetes API, in one place.

- `names`: apimachinery's naming rules (label keys, DNS labels and subdomains), with the API
  server's messages; pure, so the store may use them;
- `resources`: the PodLocator custom resource (group, version, kind, plural, labels); pure;
- `client`: the official client's construction, and the one raw request helper (status, body,
  Retry-After) behind the reflectors' LIST pages and the controller's writer and elector.
"""
