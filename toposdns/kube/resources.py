"""The PodLocator custom resource, named once (its schema: manifests/crd/podlocators.yaml)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CustomResource:
    """A custom resource's names, as its CustomResourceDefinition declares them."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        """The objects' `apiVersion`, e.g. toposdns.io/v1alpha1."""
        return f"{self.group}/{self.version}"


POD_LOCATOR = CustomResource("toposdns.io", "v1alpha1", "PodLocator", "podlocators")
#: The label that marks the controller's per-node locators (value "node").
NODE_LOCATOR_LABEL = "toposdns.io/locator"
#: The label that names a pod locator's pod's namespace, where the locator lives elsewhere (the
#: controller writes every locator in its own namespace, the only one DNS believes by default).
POD_NAMESPACE_LABEL = "toposdns.io/pod-namespace"
