"""Server flags of the adaptive worker: parsing, validation, and where they live.

SGLang has no argument-extension hook, so the flags are added to the parser by an
AFTER hook on ``ServerArgs.add_cli_args`` and read back by an AROUND hook on
``ServerArgs.from_cli_args``. ``from_cli_args`` keeps dataclass fields only, so the
values ride on an underscore attribute of the ``ServerArgs`` instance: it survives
pickling into the scheduler processes and the draft worker's ``deepcopy``.

Every unsupported combination stops start-up with one sentence (``ConfigError``),
before any process or GPU memory is touched.
"""

from __future__ import annotations

import argparse
import contextvars
import logging
import os
from typing import Any

from sglang_adaptive.policy import (
    KEEP_WARM_CHOICES,
    KEEP_WARM_NONE,
    POLICY_ALTERNATE,
    POLICY_CHOICES,
    POLICY_GOODPUT,
    POLICY_OFF,
    POLICY_THRESHOLD,
    PolicyConfig,
)

logger = logging.getLogger(__name__)

ATTR = "_adaptive_spec"
SUPPORTED_ALGORITHMS = ("EAGLE", "EAGLE3")
# With this package installed, --speculative-algorithm EAGLE/EAGLE3 (as given, not
# NEXTN, which SGLang maps to EAGLE for MTP drafts this package has not served) and
# none of its flags switch per batch with this policy.
DEFAULT_POLICY = POLICY_GOODPUT


class ConfigError(ValueError):
    """An invalid flag or unsupported combination; the message is one sentence."""


# Diagnostics: what a speculative step pays for the adaptive worker apart from its
# controller (benchmark configurations adaptive-worker-only, -backend-only, -bare).
# Each leaves the scheduler upstream's controller: every batch speculates, nothing is
# timed or decided. "worker-only" builds everything else; "backend-only" the plain
# attention backend without its graphs or the keep-warm; "bare" none of them (the
# subclass alone).
DIAG_ENV = "SGLANG_ADAPTIVE_DIAG"
DIAG_MODES = ("worker-only", "backend-only", "bare")


def diag_mode() -> str:
    """The diagnostic mode asked for in ``DIAG_ENV`` ("" for none)."""
    mode = os.environ.get(DIAG_ENV, "")
    if mode and mode not in DIAG_MODES:
        _fail(f"{DIAG_ENV}={mode!r} is not one of {', '.join(DIAG_MODES)}.")
    return mode


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "adaptive speculative decoding (sglang_adaptive)",
        "Choose per decode batch between EAGLE speculation and plain decode.",
    )
    group.add_argument(
        "--speculative-disable-batch-threshold",
        type=int,
        default=None,
        metavar="N",
        help="Run plain decode (target only, no draft or verify) for decode batches "
        "of more than N requests and speculate otherwise. Implies "
        "--speculative-switch-policy threshold.",
    )
    group.add_argument(
        "--speculative-switch-policy",
        choices=POLICY_CHOICES,
        default=None,
        help="How each decode batch picks speculative or plain decode. "
        "'off': always speculate with the upstream EAGLE worker; "
        "'threshold': see --speculative-disable-batch-threshold; "
        "'goodput': per batch, the mode with the higher predicted output tokens/s, from "
        "step times measured while serving and the measured acceptance (no number to set); "
        "'alternate': testing only, switch every --speculative-switch-alternate-period "
        "steps. Default: 'threshold' when a threshold is given; else 'goodput' with "
        "--speculative-algorithm EAGLE or EAGLE3, falling back to 'off' (with a warning) "
        "where the policies cannot serve the server; else 'off'.",
    )
    group.add_argument(
        "--speculative-cost-table-path",
        default=None,
        metavar="PATH",
        help="With a switching policy: keep the measured step-cost table (seconds per "
        "decode step by mode and batch size) and, for the goodput policy, its "
        "acceptance estimate in this JSON file, rewritten as it changes.",
    )
    group.add_argument(
        "--speculative-switch-alternate-period",
        type=int,
        default=None,
        metavar="K",
        help="Testing only: with --speculative-switch-policy alternate, run K "
        "speculative decode steps, then K plain ones, and so on (default 1).",
    )
    group.add_argument(
        "--speculative-draft-keep-warm",
        choices=KEEP_WARM_CHOICES,
        default=None,
        help="With a switching policy: what a plain decode step does for the draft model. "
        "'kv': write the draft's K/V of the new position (a projection, no draft "
        "attention or lm_head) and run one draft pass per request when speculation "
        "resumes; 'full': run the draft's extend at every plain step; 'none': leave "
        "the draft alone (acceptance drops after plain stretches). Default: 'kv' where "
        "the draft supports it (EAGLE-3 Llama draft, unquantized K/V cache), else 'none' "
        "('full' costs a draft forward at every plain step).",
    )


def _fail(sentence: str) -> None:
    raise ConfigError(f"sglang_adaptive: {sentence}")


def config_from_namespace(ns: argparse.Namespace) -> PolicyConfig:
    """Check the flags against each other and against the raw upstream flags."""
    threshold = getattr(ns, "speculative_disable_batch_threshold", None)
    policy = getattr(ns, "speculative_switch_policy", None)
    period = getattr(ns, "speculative_switch_alternate_period", None)
    cost_table_path = getattr(ns, "speculative_cost_table_path", None)
    keep_warm = getattr(ns, "speculative_draft_keep_warm", None)

    if threshold is not None and threshold < 0:
        _fail(f"--speculative-disable-batch-threshold must be >= 0, got {threshold}.")
    if period is not None and period < 1:
        _fail(f"--speculative-switch-alternate-period must be >= 1, got {period}.")
    implicit = False
    if policy is None:
        algo = (getattr(ns, "speculative_algorithm", None) or "").upper()
        if threshold is not None:
            policy = POLICY_THRESHOLD
        elif algo in SUPPORTED_ALGORITHMS:
            # A flag of ours (table path, keep-warm) asks for switching: errors stop start-up.
            policy, implicit = DEFAULT_POLICY, cost_table_path is None and keep_warm is None
        else:
            policy = POLICY_OFF
    if policy == POLICY_THRESHOLD and threshold is None:
        _fail("--speculative-switch-policy threshold needs --speculative-disable-batch-threshold N.")
    if policy != POLICY_THRESHOLD and threshold is not None:
        _fail(f"--speculative-disable-batch-threshold only applies to the threshold policy, not '{policy}'.")
    if policy != POLICY_ALTERNATE and period is not None:
        _fail("--speculative-switch-alternate-period only applies to --speculative-switch-policy alternate.")

    if policy == POLICY_OFF and cost_table_path is not None:
        _fail("--speculative-cost-table-path needs a switching policy (--speculative-switch-policy).")
    if policy == POLICY_OFF and keep_warm is not None:
        _fail("--speculative-draft-keep-warm needs a switching policy (--speculative-switch-policy).")
    if keep_warm is not None and keep_warm not in KEEP_WARM_CHOICES:
        _fail(f"--speculative-draft-keep-warm must be one of {', '.join(KEEP_WARM_CHOICES)}, got {keep_warm}.")

    config = PolicyConfig(policy=policy, threshold=threshold, alternate_period=period or 1,
                          cost_table_path=cost_table_path, keep_warm=keep_warm, implicit=implicit)
    return validated(config, lambda: check_combination(ns, config))


def validated(config: PolicyConfig, *checks) -> PolicyConfig:
    """``config`` if every check passes. A failing check stops start-up (ConfigError),
    unless the policy was only the default: then the server runs upstream's worker, as
    without this package, and says why once."""
    if not config.enabled:
        return config
    try:
        for check in checks:
            check()
    except ConfigError as err:
        if not config.implicit:
            raise
        reason = str(err).removeprefix("sglang_adaptive: ")
        logger.warning("sglang_adaptive: speculating on every batch as upstream does, since the default "
                       "policy cannot serve this server: %s", reason)
        return PolicyConfig()
    return config


def check_combination(args: Any, config: PolicyConfig) -> None:
    """Reject what the adaptive worker cannot serve. ``args`` is the raw Namespace
    before SGLang resolves defaults, then the resolved ServerArgs after."""
    flag = f"--speculative-switch-policy {config.policy}"
    diag_mode()
    algo = (getattr(args, "speculative_algorithm", None) or "").upper()
    if algo not in SUPPORTED_ALGORITHMS and algo != "NEXTN":
        _fail(f"{flag} needs --speculative-algorithm EAGLE or EAGLE3, got {algo or 'none'}.")
    topk = getattr(args, "speculative_eagle_topk", None)
    if topk is not None and topk > 1:
        _fail(f"{flag} supports --speculative-eagle-topk 1 only (chain drafts), got {topk}.")
    if getattr(args, "enable_dp_attention", False):
        _fail(f"{flag} does not support DP attention (--enable-dp-attention) yet.")
    if (getattr(args, "pp_size", 1) or 1) > 1:
        _fail(f"{flag} does not support pipeline parallelism (--pp-size > 1).")
    if getattr(args, "speculative_adaptive", False):
        _fail(f"{flag} and upstream --speculative-adaptive both pick the step count per batch; use one of them.")
    if getattr(args, "enable_multi_layer_eagle", False):
        _fail(f"{flag} does not support --enable-multi-layer-eagle.")
    if config.keep_warm not in (None, KEEP_WARM_NONE) and algo != "EAGLE3":
        _fail(f"--speculative-draft-keep-warm {config.keep_warm} needs --speculative-algorithm EAGLE3 "
              f"(an EAGLE draft reads the target's last hidden state, which plain steps do not keep).")


def check_model_family(server_args: Any, config: PolicyConfig, model_config: Any = None) -> None:
    """Reject model families whose plain step would crash or answer wrongly.

    ``model_config``: SGLang's ModelConfig of the target (built from the server
    args when not given; it reads the model's config, no weights)."""
    from sglang_adaptive.upstream import sglang_symbols as up

    flag = f"--speculative-switch-policy {config.policy}"
    if model_config is None:
        model_config = up.ModelConfig.from_server_args(server_args)
    arch = (getattr(model_config.hf_config, "architectures", None) or ["this model"])[0]
    if model_config.model_is_mrope:
        # ForwardBatch.init_new computes mrope positions from seq_lens_cpu, which the
        # overlap scheduler leaves unset for a plain batch: the scheduler would die.
        _fail(f"{flag} does not support models with mrope positions ({arch}) yet.")
    if up.mambaish_config(model_config) is not None:
        # Plain batches take the speculative prepare path, which sets no mamba track
        # indices: recurrent-state checkpoints the radix cache hands out would be stale.
        _fail(f"{flag} does not support hybrid linear-attention models ({arch}) yet.")
    algo = (getattr(server_args, "speculative_algorithm", None) or "").upper()
    if algo == "EAGLE" and getattr(server_args, "enable_return_hidden_states", False):
        # An eager plain step of an EAGLE (not EAGLE-3) server returns fewer hidden
        # state rows than tokens.
        _fail(f"{flag} does not support --enable-return-hidden-states with EAGLE; use EAGLE3.")


def attach(server_args: Any, config: PolicyConfig) -> None:
    setattr(server_args, ATTR, config)


def get_config(server_args: Any) -> PolicyConfig:
    """The policy of a ServerArgs; off when none of the flags was given."""
    return getattr(server_args, ATTR, None) or PolicyConfig()


# -- hook bodies (registered in hooks.py) -----------------------------------


def after_add_cli_args(result, parser, *args, **kwargs):
    add_cli_args(parser)
    return result


# The flags as keyword arguments of ServerArgs(...), which sglang.Engine(**kwargs) builds.
FLAG_KWARGS = ("speculative_disable_batch_threshold", "speculative_switch_policy",
               "speculative_switch_alternate_period", "speculative_cost_table_path",
               "speculative_draft_keep_warm")


class _WithFlags:
    """ServerArgs seen with this package's flags, as config_from_namespace reads a Namespace."""

    def __init__(self, server_args, flags: dict):
        self._server_args, self._flags = server_args, flags

    def __getattr__(self, name):
        if name in self._flags:
            return self._flags[name]
        return None if name in FLAG_KWARGS else getattr(self._server_args, name)


# Set while from_cli_args builds its ServerArgs: it validates and attaches the config itself.
_FROM_CLI = contextvars.ContextVar("sglang_adaptive_from_cli", default=False)


def around_server_args_init(original, self, *args, **kwargs):
    # ServerArgs(**kwargs) (the Engine API) would reject our flags: they are not
    # dataclass fields. from_cli_args passes fields only and attaches its own config.
    flags = {name: kwargs.pop(name) for name in FLAG_KWARGS if name in kwargs}
    # The algorithm as given: SGLang resolves NEXTN to EAGLE, which the default skips.
    given = {k: kwargs[k] for k in ("speculative_algorithm",) if k in kwargs}
    original(self, *args, **kwargs)
    if _FROM_CLI.get():
        return
    config = config_from_namespace(_WithFlags(self, {**given, **flags}))
    attach(self, validated(config, lambda: check_model_family(self, config)))


def around_from_cli_args(original, cls, args, *rest, **kwargs):
    config = config_from_namespace(args)
    token = _FROM_CLI.set(True)
    try:
        server_args = original(cls, args, *rest, **kwargs)
    finally:
        _FROM_CLI.reset(token)
    # SGLang may have resolved topk / the algorithm alias (NEXTN -> EAGLE) since.
    attach(server_args, validated(config, lambda: check_combination(server_args, config),
                                  lambda: check_model_family(server_args, config)))
    return server_args
