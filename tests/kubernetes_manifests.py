"""deploy/kubernetes read as `kubectl apply -k` would build it: the base's resources, and the GPU
variant with its patch merged the way kustomize merges a StatefulSet patch (maps key by key,
containers by name, env entries by name)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "deploy" / "kubernetes"
MERGE_KEYS = {"containers": "name", "env": "name", "volumeMounts": "name", "ports": "name"}

Obj = dict[str, Any]


def load_kustomization(folder: Path) -> list[Obj]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for resource in spec.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            objects += load_kustomization(path)
        else:
            objects += [o for o in yaml.safe_load_all(path.read_text()) if o]
    for patch in spec.get("patches", []):
        change = yaml.safe_load((folder / patch["path"]).read_text())
        target = find(objects, change["kind"], change["metadata"]["name"])
        _merge(target, change)
    return objects


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def _merge(target: Obj, change: Obj) -> None:
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(target.get(key), list):
            by = MERGE_KEYS[key]
            for item in value:
                same = [t for t in target[key] if t.get(by) == item.get(by)]
                if same:
                    _merge(same[0], item)
                else:
                    target[key].append(copy.deepcopy(item))
        else:
            target[key] = copy.deepcopy(value)
