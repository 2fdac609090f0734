#!/usr/bin/env bash
# Make the plugin importable on the registry-less GPU host, after
# `source .gpu-bundle/gpu/setup-host.sh`. pip needs setuptools to build the
# editable install; where the host's Python lacks it, write the same entry-point
# metadata by hand (SGLang discovers plugins through importlib.metadata).
# usage: source scripts/install-on-gpu-host.sh
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if python3 -m pip install -q --no-deps --no-build-isolation -e "$repo/python" >/tmp/plugin-pip.log 2>&1; then
    echo "[plugin] installed with pip (editable)"
else
    site="${SITE_DIR:-/tmp/site}"
    info="$(python3 - "$repo/python/pyproject.toml" "$site" <<'PY'
import sys, tomllib, pathlib
project = tomllib.loads(pathlib.Path(sys.argv[1]).read_text())["project"]
info = pathlib.Path(sys.argv[2]) / f"sglang_adaptive_spec-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
         for group, eps in project["entry-points"].items()]
(info / "entry_points.txt").write_text("\n".join(lines))
print(info)
PY
)"
    export PYTHONPATH="$repo/python:${PYTHONPATH:-}"
    echo "[plugin] pip failed (see /tmp/plugin-pip.log); wrote $info and put $repo/python on PYTHONPATH"
fi
python3 -c "from importlib.metadata import entry_points as e; assert any(p.name == 'adaptive_spec' for p in e(group='sglang.srt.plugins')), 'plugin entry point missing'"
