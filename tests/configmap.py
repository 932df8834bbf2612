"""A directory laid out as the kubelet mounts a ConfigMap, updated as the kubelet updates it."""

from __future__ import annotations

import os
from pathlib import Path


class ConfigMap:
    """`Corefile` -> `..data/Corefile`, `..data` -> a versioned directory, swapped whole on an
    update (a new directory, then a symlink renamed over `..data`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.version = 0
        (directory / "Corefile").symlink_to("..data/Corefile")

    @property
    def path(self) -> Path:
        return self.directory / "Corefile"

    def write(self, text: str) -> None:
        self.version += 1
        data = self.directory / f"..v{self.version}"
        data.mkdir()
        (data / "Corefile").write_text(text)
        link = self.directory / "..data_tmp"
        link.symlink_to(data.name)
        os.replace(link, self.directory / "..data")
