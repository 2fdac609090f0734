"""Build-time check of the serving image, run by a RUN step of docker/Dockerfile.

    python docker/check_image.py --sglang-version 0.5.17 --torch-cuda 13.0

Fails the build (exit 1, one line per problem) unless:
  * the installed SGLang (package metadata and ``sglang.__version__``) is the version
    the image asks for, and that version is ``sglang_adaptive.upstream.PINNED_SGLANG_VERSION``;
  * this package's ``adaptive_spec`` entry point is in the ``sglang.srt.plugins``
    group (the one SGLang's ``load_plugins()`` reads), points at
    ``sglang_adaptive.plugin:register`` and loads to a callable;
  * torch was built for the CUDA major.minor of the base image (``--torch-cuda``).

test/unit/test_docker.py runs the same script in the CPU virtualenv.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "adaptive_spec"
PLUGIN_TARGET = "sglang_adaptive.plugin:register"


def problems(sglang_version: str, torch_cuda: str | None) -> list[str]:
    found: list[str] = []

    installed = metadata.version("sglang")
    if installed != sglang_version:
        found.append(f"sglang {installed} is installed, the image asks for {sglang_version}")
    import sglang

    if sglang.__version__ != sglang_version:
        found.append(f"sglang.__version__ is {sglang.__version__}, expected {sglang_version}")

    from sglang_adaptive.upstream import PINNED_SGLANG_VERSION

    if PINNED_SGLANG_VERSION != sglang_version:
        found.append(
            f"sglang_adaptive is pinned to sglang {PINNED_SGLANG_VERSION}, "
            f"the image asks for {sglang_version}"
        )

    eps = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if len(eps) != 1:
        found.append(f"{len(eps)} '{PLUGIN_NAME}' entry points in group {PLUGIN_GROUP}, expected 1")
    elif eps[0].value != PLUGIN_TARGET:
        found.append(f"entry point {PLUGIN_NAME} = {eps[0].value}, expected {PLUGIN_TARGET}")
    elif not callable(eps[0].load()):
        found.append(f"entry point {PLUGIN_NAME} does not load to a callable")

    if torch_cuda is not None:
        import torch

        built = torch.version.cuda or "none (CPU build)"
        if built.split(".")[:2] != torch_cuda.split(".")[:2]:
            found.append(f"torch {torch.__version__} is built for CUDA {built}, the image has {torch_cuda}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-version", required=True)
    parser.add_argument("--torch-cuda", default=None, help="CUDA major.minor of the base image")
    args = parser.parse_args(argv)
    found = problems(args.sglang_version, args.torch_cuda)
    for line in found:
        print(f"check_image: {line}", file=sys.stderr)
    if found:
        return 1
    print(
        f"check_image: sglang {args.sglang_version}, entry point {PLUGIN_GROUP}:{PLUGIN_NAME} "
        f"-> {PLUGIN_TARGET}" + (f", torch CUDA {args.torch_cuda}" if args.torch_cuda else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
