"""The TOML writer's output reads back (with Python's own tomllib) as the document it
was given: top-level keys, tables, arrays of tables, inline tables, quoting."""

import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stagehand_ray import toml  # noqa: E402

DOCUMENT = {
    "bind": "127.0.0.1:0",
    "api_key": 'a "quoted" key\\with a backslash',
    "settings": "/etc/stagehand/profiles/workstation-24gb.toml",
    "limits": {"drain_seconds": 5, "request_timeout_seconds": 2.5, "queue_depth": 2},
    "admin": {"key": "k", "model_roots": ["/models", "/more models"]},
    "models": [
        {"name": "bert", "folder": "/models/bert", "max_batch_tokens": 4096},
        {"name": "llama", "folder": "/models/llama", "lora": ["a.safetensors:0.5"],
         "adapters": {"style": "s.safetensors", "odd name": "o.safetensors:1.0"}},
    ],
}


def main() -> int:
    text = toml.dumps(DOCUMENT)
    back = tomllib.loads(text)
    if back != DOCUMENT:
        print(f"FAIL: the TOML reads back differently:\n{text}\n{back}")
        return 1
    try:
        toml.dumps({"x": float("nan")})
    except ValueError:
        pass
    else:
        print("FAIL: NaN was written")
        return 1
    print("ok: the serve config writer round-trips through tomllib")
    return 0


if __name__ == "__main__":
    sys.exit(main())
