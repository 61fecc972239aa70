"""Write a copy of a DeepSpeed JSON with settings changed, for issue 6's sweeps.

Each change is DOTTED.KEY=JSON, e.g. zero_optimization.reduce_bucket_size='"auto"' or
compile='{"deepcompile": true}'.
usage: python benchmarks/scripts/ds_variant.py SOURCE.json TARGET.json CHANGE..."""

import json
import sys
from pathlib import Path

source, target, *changes = sys.argv[1:]
config = json.loads(Path(source).read_text())
for change in changes:
    dotted, value = change.split("=", 1)
    *parents, key = dotted.split(".")
    section = config
    for parent in parents:
        section = section.setdefault(parent, {})
    section[key] = json.loads(value)
Path(target).write_text(json.dumps(config, indent=1))
