"""The node layout shared with the Ansible side: paths and unit names, from layout.yml.

layout.yml (shipped in the package) holds the defaults; the Ansible role twinspark_layout is generated from it
(generate.py) and writes the effective values, inventory overrides included, to /etc/twinspark/layout.json on each
node. `current()` lays that file over the defaults when it exists, so a tool on the node follows the inventory.
Controller-side tools take the same values from the inventory variables `twinspark_layout_<name>` (`from_vars`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from twinspark import settings

VAR_PREFIX = "twinspark_layout_"
LAYOUT_FILE_ENV = "TWINSPARK_LAYOUT_FILE"


@dataclass(frozen=True)
class Entry:
    name: str
    default: str
    type: str
    doc: str

    @property
    def var(self) -> str:
        return VAR_PREFIX + self.name


@functools.cache
def entries() -> tuple[Entry, ...]:
    """The registry in layout.yml, in file order (read once per process: it is part of the package)."""
    text = resources.files("twinspark").joinpath("layout.yml").read_text(encoding="utf-8")
    raw = yaml.load(text, Loader=settings.SAFE_LOADER)
    return tuple(Entry(name, str(spec["default"]), spec["type"], " ".join(str(spec["doc"]).split()))
                 for name, spec in raw.items())


@dataclass(frozen=True)
class Layout:
    pair_id: str
    venv: str
    runtime_root: str
    state_dir: str
    service_user: str
    control_dir: str
    restart_flag: str
    pair_lock: str
    router_drain_key: str
    router_drain_ca: str
    router_drain_admin: str
    guard_pause: str
    guard_dir: str
    guard_state: str
    model_manifest: str
    node_file: str
    serve_env: str
    secrets_env: str
    api_key_digests: str
    unit_vllm: str
    unit_pair_guard: str
    unit_pair_guard_timer: str
    unit_pair_guard_kick: str
    unit_health: str
    unit_health_timer: str
    unit_firewall: str
    unit_firewall_watch: str
    pair_args: str
    firewall_state: str
    bandwidth_record: str
    router_port: str
    router_metrics_port: str
    router_admin_port: str
    router_upstream_port: str
    metrics_dir: str
    monitoring_record: str
    prometheus_port: str
    alertmanager_port: str
    node_exporter_port: str

    @property
    def cli(self) -> str:
        """The `twinspark` command in the node's venv."""
        return f"{self.venv}/bin/twinspark"

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"


def defaults() -> dict[str, str]:
    return {entry.name: entry.default for entry in entries()}


def overlay(values: Mapping[str, object], source: str) -> Layout:
    """The defaults with `values` (name -> value) laid over them. An unknown name or a value that is not a
    non-empty string is an error naming `source` and the key."""
    merged = defaults()
    for name, value in values.items():
        if name not in merged:
            raise ValueError(f"{source}: unknown layout key {name!r} (known: {', '.join(merged)})")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{source}: layout key {name!r} must be a non-empty string")
        merged[name] = value
    return Layout(**merged)


def default() -> Layout:
    """layout.yml's values, without any node file (controller-side tools that read no inventory)."""
    return overlay({}, "layout.yml")


def load(node_file: Path | None = None) -> Layout:
    """The layout on this node: the defaults, overlaid with the node file when it exists. TWINSPARK_LAYOUT_FILE
    names another file (tests, or a tool run against a copy). An account that may not read the file (it lives in
    the 0750 /etc/twinspark, like serve.env) gets the defaults."""
    path = Path(node_file or os.environ.get(LAYOUT_FILE_ENV) or defaults()["node_file"])
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, PermissionError):
        return default()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}); rerun site.yml to rewrite it") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: must hold one JSON object; rerun site.yml to rewrite it")
    return overlay(values, str(path))


@functools.cache
def current() -> Layout:
    """This node's layout, read once per process."""
    return load()


def from_vars(hostvars: Mapping[str, object]) -> Layout:
    """The layout an inventory gives a host (controller side): `twinspark_layout_<name>` over the defaults."""
    values = {entry.name: hostvars[entry.var] for entry in entries() if entry.var in hostvars}
    return overlay(values, "inventory")
