"""Server configurations compared by the benchmark: one source for the shared flags.

A *pair* says which target and draft to serve (and how: dummy weights with
simulated acceptance, or real checkpoints); a *configuration* is one server: the
pair plus a decoding mode. Every configuration of a run gets the same common
flags, so only the mode differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sglang_adaptive.args import DIAG_ENV, DIAG_MODES
from sglang_adaptive.testing import COMMON_ARGS, STATIC_ARGS, eagle3_args, without_flags

REPO = Path(__file__).resolve().parents[3]
MODELS = REPO / "benchmark" / "models"
TINY_PAIR = REPO / "test" / "fixtures" / "tiny-pair"
UPSTREAM_ADAPTIVE_CONFIG = REPO / "benchmark" / "upstream-adaptive-max3.json"

# Static configurations set the bar; the others are reported as a ratio to the best.
STATIC = ("plain", "eagle3")
LABELS = ("plain", "eagle3", "upstream-adaptive", "adaptive-threshold", "adaptive-goodput")


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    draft: Path
    args: tuple = ()  # e.g. --load-format dummy
    spec_env: dict = field(default_factory=dict)  # e.g. simulated acceptance, speculative servers only
    server_args: tuple = ()  # after the common flags, so they override them (attention backend, --tp)
    shape: str = ""  # the rows' `shape` field
    acceptance: str | float = "real"  # the rows' `acceptance` field: simulated value or "real"


def dummy_pair(acc_len: float = 2.5, models: Path = MODELS) -> Pair:
    """The shipped Llama-3-8B-shaped configs, random weights, acceptance simulated by SGLang."""
    return Pair("dummy-llama3-8b", models / "llama3-8b", models / "llama3-8b-eagle3",
                ("--load-format", "dummy"), {"SGLANG_SIMULATE_ACC_LEN": str(acc_len)},
                shape="llama3-8b-tp1", acceptance=acc_len)


# The users' flags (K2.5 on 8 GPUs) at the tested tensor parallel size.
K25_FLAGS = ("--attention-backend", "flashinfer", "--disable-custom-all-reduce",
             "--enable-flashinfer-allreduce-fusion")


# Target depths shipped (benchmark/models/README.md): 4 layers start in a minute; 16
# make a decode step long enough (about 10 ms at batch 128 on two H200s) that the
# scheduler's host work hides behind the GPU, as it does on the users' 61 layers.
K25_LAYERS = {4: "k25-tp2", 16: "k25-tp2-l16"}


def k25_pair(acc_len: float = 2.5, tp: int = 2, models: Path = MODELS, layers: int = 4) -> Pair:
    """The Kimi-K2.5-shaped MLA + MoE configs (benchmark/models/README.md), random
    weights, simulated acceptance, the users' flags at ``--tp tp``."""
    if layers not in K25_LAYERS:
        raise ValueError(f"the K2.5-shaped target ships with {sorted(K25_LAYERS)} layers, not {layers}")
    shape = f"k25-tp{tp}" if layers == 4 else f"k25-l{layers}-tp{tp}"
    return Pair(shape, models / K25_LAYERS[layers], models / "k25-tp2-eagle3",
                ("--load-format", "dummy", "--context-length", "4096"),
                {"SGLANG_SIMULATE_ACC_LEN": str(acc_len)},
                server_args=("--tp", str(tp), *K25_FLAGS), shape=shape, acceptance=acc_len)


def tiny_pair(path: Path = TINY_PAIR) -> Pair:
    """The project's trained 2 MB pair: real weights, real acceptance."""
    return Pair("tiny-pair", path / "target", path / "eagle3", shape="tiny-llama-tp1")


def prompt_vocab(pair_name: str) -> int:
    """Prompt token ids stay below this for the pair named as ``--pair`` names it:
    the tiny pair's vocabulary holds 1024 ids, and an id past it trips a device assert."""
    return {"tiny": 1024, "k25": 163840}.get(pair_name, 32000)


def custom_pair(target: str, draft: str) -> Pair:
    return Pair("custom", Path(target), Path(draft))


@dataclass(frozen=True)
class ServerConfig:
    label: str
    args: list
    env: dict
    strategy: str | None = None  # --speculative-draft-keep-warm, where set (the rows' `strategy`)
    tokenizer: bool = False  # the server detokenizes (structured output needs the tokenizer)

    @property
    def decides_by_costs(self) -> bool:
        """The goodput policy: the bench keeps its step-cost table after every point."""
        args = [str(x) for x in self.args]
        return ("--speculative-switch-policy", "goodput") in zip(args, args[1:])

    def command(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return " ".join(filter(None, [env, "python -m sglang.launch_server", *map(str, self.args)]))


def common_args(pair: Pair, max_bs: int) -> list:
    # A pair's own flags replace the common ones they name (the attention backend).
    common = without_flags(COMMON_ARGS, [a for a in pair.server_args if a.startswith("--")])
    return [
        "--model-path", str(pair.target), *pair.args, *common, *pair.server_args,
        "--max-running-requests", str(max_bs), "--cuda-graph-max-bs", str(max_bs),
        # The adaptive worker logs its mode counters at this interval; the report
        # turns them into the plain share per load point and the mode over time.
        "--decode-log-interval", "10",
    ]


# Structured output: xgrammar and the tokenizer (plain batches hold constrained
# requests by default).
GRAMMAR_ARGS = ("--grammar-backend", "xgrammar", "--constrained-json-disable-any-whitespace")


def server_configs(pair: Pair, labels=LABELS, *, threshold: int = 16, steps: int = 3,
                   max_bs: int = 128, keep_warm=(), grammar: bool = False) -> list[ServerConfig]:
    """``keep_warm``: draft keep-warm strategies; each switching configuration is then
    served once per strategy, labelled LABEL-STRATEGY. ``grammar``: serve structured
    output (needs a pair with a tokenizer)."""
    base = common_args(pair, max_bs)
    if grammar:
        base = without_flags(base, ["--grammar-backend"]) + list(GRAMMAR_ARGS)
    spec = base + eagle3_args(pair.draft, steps)
    never_plain = spec + ["--speculative-disable-batch-threshold", "100000"]
    table = {
        "plain": (base, {}),
        "eagle3": (spec + list(STATIC_ARGS), pair.spec_env),
        "upstream-adaptive": (spec + [*STATIC_ARGS, "--speculative-adaptive", "--speculative-adaptive-config",
                                      str(UPSTREAM_ADAPTIVE_CONFIG)], pair.spec_env),
        "adaptive-threshold": (spec + ["--speculative-disable-batch-threshold", str(threshold)],
                               pair.spec_env),
        "adaptive-goodput": (spec + ["--speculative-switch-policy", "goodput"], pair.spec_env),
        # What the package costs when it does nothing: static EAGLE-3 with SGLang's
        # plugin loading pointed elsewhere (no hooks at all), against "eagle3" (hooks
        # applied, policy off) and a policy that never goes plain.
        "eagle3-without-plugin": (spec, {**pair.spec_env, "SGLANG_PLUGINS": "none"}),
        "adaptive-never-plain": (never_plain, pair.spec_env),
        # Never-plain split further (args.DIAG_MODES), each with upstream's controller: the
        # worker and all its resources, its plain attention backend only, the subclass alone.
        **{f"adaptive-{mode}": (never_plain, {**pair.spec_env, DIAG_ENV: mode}) for mode in DIAG_MODES},
    }
    unknown = [label for label in labels if label not in table]
    if unknown:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(table)}")
    out = []
    for label in labels:
        args, env = table[label]
        if label.startswith("adaptive-") and keep_warm:
            out += [ServerConfig(f"{label}-{s}", [*args, "--speculative-draft-keep-warm", s], dict(env), s, grammar)
                    for s in keep_warm]
        else:
            out.append(ServerConfig(label, list(args), dict(env), tokenizer=grammar))
    return out
