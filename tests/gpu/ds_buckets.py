"""Write a copy of a DeepSpeed JSON with ZeRO settings given as KEY=VALUE (issue 6 sweeps).
usage: python tests/gpu/ds_buckets.py SOURCE.json TARGET.json reduce_bucket_size=5e8 ..."""

import json
import sys
from pathlib import Path

source, target, *pairs = sys.argv[1:]
config = json.loads(Path(source).read_text())
for pair in pairs:
    key, value = pair.split("=")
    config["zero_optimization"][key] = int(float(value))
Path(target).write_text(json.dumps(config, indent=1))
