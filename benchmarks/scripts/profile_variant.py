"""Write a changed copy of a profile for sweeps: its YAML, and its DeepSpeed JSON where it has one.

Each change is DOTTED.KEY=JSON. Keys under `ds.` change the DeepSpeed JSON
(ds.timers.throughput.enabled=false, ds.zero_optimization.stage3_prefetch_bucket_size=2e8,
ds.compile='{"deepcompile": true}'), the others the YAML (fsdp_config.fsdp_reshard_after_forward=false).
The copy's YAML points at the copied JSON.
usage: python benchmarks/scripts/profile_variant.py PROFILE.yaml TARGET.yaml CHANGE...
"""

import json
import sys
from pathlib import Path

import yaml


def set_dotted(config: dict, dotted: str, value: object) -> None:
    *parents, key = dotted.split(".")
    for parent in parents:
        config = config.setdefault(parent, {})
    config[key] = value


def write_variant(source: Path, target: Path, changes: list[str]) -> None:
    settings = yaml.safe_load(source.read_text())
    deepspeed = settings.get("deepspeed_config", {})
    json_path = deepspeed.get("deepspeed_config_file")
    ds_config = json.loads((source.parent.parent / json_path).read_text()) if json_path else None
    for change in changes:
        dotted, value = change.split("=", 1)
        if dotted.startswith("ds."):
            if ds_config is None:
                sys.exit(f"profile_variant: {source} has no DeepSpeed JSON to change ({dotted})")
            set_dotted(ds_config, dotted[3:], json.loads(value))
        else:
            set_dotted(settings, dotted, json.loads(value))
    if ds_config is not None:
        copied = target.with_suffix(".json")
        copied.write_text(json.dumps(ds_config, indent=1))
        deepspeed["deepspeed_config_file"] = str(copied.resolve())
    target.write_text(yaml.safe_dump(settings, sort_keys=False))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python benchmarks/scripts/profile_variant.py PROFILE.yaml TARGET.yaml CHANGE...")
    write_variant(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
