"""Flags reach ServerArgs through SGLang's own parser; bad combinations stop start-up."""

import copy
import logging
import pickle

import pytest
from conftest import TARGET, eagle3_argv

from sglang_adaptive.args import ConfigError, get_config
from sglang_adaptive.policy import PolicyConfig


@pytest.mark.parametrize(
    "argv, message",
    [
        (eagle3_argv("--speculative-disable-batch-threshold", "-1"),
         "--speculative-disable-batch-threshold must be >= 0, got -1."),
        (eagle3_argv("--speculative-switch-policy", "off", "--speculative-cost-table-path", "/tmp/costs.json"),
         "--speculative-cost-table-path needs a switching policy (--speculative-switch-policy)."),
        (["--device", "cpu", "--model-path", str(TARGET), "--speculative-disable-batch-threshold", "8"],
         "--speculative-switch-policy threshold needs --speculative-algorithm EAGLE or EAGLE3, got none."),
        (["--device", "cpu", "--model-path", str(TARGET), "--speculative-algorithm", "NGRAM",
          "--speculative-switch-policy", "alternate"],
         "--speculative-switch-policy alternate needs --speculative-algorithm EAGLE or EAGLE3, got NGRAM."),
        (eagle3_argv("--speculative-disable-batch-threshold", "8", "--speculative-eagle-topk", "2"),
         "supports --speculative-eagle-topk 1 only (chain drafts), got 2."),
        (eagle3_argv("--speculative-disable-batch-threshold", "8", "--enable-dp-attention",
                     "--dp-size", "2", "--tp-size", "2"),
         "does not support DP attention (--enable-dp-attention) yet."),
        (eagle3_argv("--speculative-disable-batch-threshold", "8", "--pp-size", "2"),
         "does not support pipeline parallelism (--pp-size > 1)."),
        (eagle3_argv("--speculative-disable-batch-threshold", "8", "--speculative-adaptive"),
         "upstream --speculative-adaptive both pick the step count per batch; use one of them."),
        (eagle3_argv("--speculative-disable-batch-threshold", "8", "--enable-multi-layer-eagle"),
         "does not support --enable-multi-layer-eagle."),
        (eagle3_argv("--speculative-switch-policy", "threshold"),
         "--speculative-switch-policy threshold needs --speculative-disable-batch-threshold N."),
        (eagle3_argv("--speculative-switch-policy", "alternate", "--speculative-disable-batch-threshold", "8"),
         "--speculative-disable-batch-threshold only applies to the threshold policy, not 'alternate'."),
        (eagle3_argv("--speculative-switch-alternate-period", "3"),
         "--speculative-switch-alternate-period only applies to --speculative-switch-policy alternate."),
        (eagle3_argv("--speculative-switch-policy", "alternate", "--speculative-switch-alternate-period", "0"),
         "--speculative-switch-alternate-period must be >= 1, got 0."),
    ],
)
def test_invalid_flags_stop_start_up_with_one_sentence(parse, argv, message):
    with pytest.raises(ConfigError) as err:
        parse(argv)
    text = str(err.value)
    assert text.startswith("sglang_adaptive: ") and text.endswith(message)
    assert text.count(". ") == 0  # one sentence


def test_diagnostic_worker_modes_are_checked_at_start_up(parse, monkeypatch):
    argv = eagle3_argv("--speculative-disable-batch-threshold", "100000")
    monkeypatch.setenv("SGLANG_ADAPTIVE_DIAG", "worker_only")
    with pytest.raises(ConfigError) as err:
        parse(argv)
    assert str(err.value) == (
        "sglang_adaptive: SGLANG_ADAPTIVE_DIAG='worker_only' is not one of worker-only, backend-only, bare.")
    for mode in ("worker-only", "backend-only", "bare", ""):
        monkeypatch.setenv("SGLANG_ADAPTIVE_DIAG", mode)
        assert get_config(parse(argv)).policy == "threshold"


def test_threshold_reaches_server_args_and_survives_process_copies(parse):
    server_args = parse(eagle3_argv("--speculative-disable-batch-threshold", "16"))
    expected = PolicyConfig(policy="threshold", threshold=16, alternate_period=1)
    assert get_config(server_args) == expected
    # Scheduler processes receive a pickled copy; the draft worker a deepcopy.
    assert get_config(pickle.loads(pickle.dumps(server_args))) == expected
    assert get_config(copy.deepcopy(server_args)) == expected


def test_alternate_policy_for_tests(parse):
    server_args = parse(eagle3_argv("--speculative-switch-policy", "alternate",
                                    "--speculative-switch-alternate-period", "7"))
    assert get_config(server_args) == PolicyConfig("alternate", None, 7)


def test_goodput_policy_needs_no_number_and_keeps_its_table_path(parse):
    server_args = parse(eagle3_argv("--speculative-switch-policy", "goodput",
                                    "--speculative-cost-table-path", "/tmp/costs.json"))
    assert get_config(server_args) == PolicyConfig("goodput", None, 1, "/tmp/costs.json")
    assert get_config(pickle.loads(pickle.dumps(server_args))).cost_table_path == "/tmp/costs.json"


def test_eagle_without_our_flags_switches_with_the_goodput_policy(parse):
    default = get_config(parse(eagle3_argv()))
    assert default == PolicyConfig("goodput") and default.implicit
    assert get_config(pickle.loads(pickle.dumps(parse(eagle3_argv())))).implicit
    eagle = [a if a != "EAGLE3" else "EAGLE" for a in eagle3_argv()]
    assert get_config(parse(eagle)).policy == "goodput"
    # A flag of ours asks for switching: no longer only the default.
    asked = get_config(parse(eagle3_argv("--speculative-cost-table-path", "/tmp/costs.json")))
    assert asked == PolicyConfig("goodput", cost_table_path="/tmp/costs.json") and not asked.implicit


def test_policy_off_without_speculation_or_when_asked(parse):
    assert get_config(parse(["--device", "cpu", "--model-path", str(TARGET)])) == PolicyConfig()
    assert get_config(parse(eagle3_argv("--speculative-switch-policy", "off"))) == PolicyConfig()
    # NEXTN (MTP drafts, which SGLang serves as EAGLE) keeps upstream's worker unless asked.
    nextn = [a if a != "EAGLE3" else "NEXTN" for a in eagle3_argv()]
    assert get_config(parse(nextn)) == PolicyConfig()


@pytest.fixture()
def args_log(caplog):
    """Warnings of sglang_adaptive.args: SGLang's parser reconfigures the root logger
    (where caplog listens), so listen on the module's own logger."""
    logger = logging.getLogger("sglang_adaptive.args")
    logger.addHandler(caplog.handler)
    try:
        yield lambda: [r.getMessage() for r in caplog.records if r.name == logger.name]
    finally:
        logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("extra, reason", [
    (("--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"),
     "--speculative-switch-policy goodput supports --speculative-eagle-topk 1 only (chain drafts), got 2."),
    (("--speculative-adaptive",),
     "--speculative-switch-policy goodput and upstream --speculative-adaptive both pick the step count "
     "per batch; use one of them."),
])
def test_the_default_falls_back_to_upstream_where_it_cannot_serve(parse, args_log, extra, reason):
    """Nobody asked for switching: the server starts as it would without this package."""
    assert get_config(parse(eagle3_argv(*extra))) == PolicyConfig()
    assert args_log() == [
        "sglang_adaptive: speculating on every batch as upstream does, since the default policy "
        "cannot serve this server: " + reason]
    # Asked for: the same combination stops start-up.
    with pytest.raises(ConfigError, match="supports --speculative-eagle-topk 1 only|both pick"):
        parse(eagle3_argv("--speculative-switch-policy", "goodput", *extra))


def test_server_args_built_without_cli_default_to_off():
    assert get_config(object()) == PolicyConfig()


# -- model families whose plain step would crash or answer wrongly -----------------


def write_config(path, config, arch):
    import json

    data = config.to_dict()
    data["architectures"] = [arch]
    path.mkdir()
    (path / "config.json").write_text(json.dumps(data))
    return path


@pytest.fixture()
def family_configs(tmp_path):
    import transformers

    vl = transformers.Qwen2_5_VLConfig()
    # The mrope layout of the published Qwen2.5-VL configs.
    text = vl.text_config
    text.rope_parameters = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    return {
        "mrope": write_config(tmp_path / "qwen25vl", vl, "Qwen2_5_VLForConditionalGeneration"),
        "hybrid": write_config(tmp_path / "qwen3next", transformers.Qwen3NextConfig(num_hidden_layers=4),
                               "Qwen3NextForCausalLM"),
    }


@pytest.mark.parametrize("family, message", [
    ("mrope", "--speculative-switch-policy threshold does not support models with mrope positions "
              "(Qwen2_5_VLForConditionalGeneration) yet."),
    ("hybrid", "--speculative-switch-policy threshold does not support hybrid linear-attention models "
               "(Qwen3NextForCausalLM) yet."),
])
def test_model_families_the_plain_step_cannot_serve_are_refused(plugins, family_configs, family, message):
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_adaptive.args import check_model_family

    config = PolicyConfig(policy="threshold", threshold=8)
    model_config = ModelConfig(str(family_configs[family]))
    with pytest.raises(ConfigError) as err:
        check_model_family(object(), config, model_config)
    assert str(err.value) == "sglang_adaptive: " + message


def test_hybrid_model_is_refused_from_the_command_line(parse, family_configs):
    argv = eagle3_argv("--speculative-disable-batch-threshold", "8", "--disable-radix-cache")
    argv[argv.index("--model-path") + 1] = str(family_configs["hybrid"])
    with pytest.raises(ConfigError, match="does not support hybrid linear-attention models"):
        parse(argv)


def test_the_default_falls_back_on_a_model_family_it_cannot_serve(parse, family_configs, args_log):
    argv = eagle3_argv("--disable-radix-cache")
    argv[argv.index("--model-path") + 1] = str(family_configs["hybrid"])
    assert get_config(parse(argv)) == PolicyConfig()
    assert args_log() == ["sglang_adaptive: speculating on every batch as upstream does, since the default "
                          "policy cannot serve this server: --speculative-switch-policy goodput does not "
                          "support hybrid linear-attention models (Qwen3NextForCausalLM) yet."]


def test_return_hidden_states_is_refused_with_eagle_not_eagle3(parse):
    from types import SimpleNamespace as NS

    from sglang_adaptive.args import check_model_family

    from sglang.srt.configs.model_config import ModelConfig

    llama = ModelConfig.from_server_args(parse(eagle3_argv("--speculative-disable-batch-threshold", "8")))
    config = PolicyConfig(policy="threshold", threshold=8)
    eagle = NS(speculative_algorithm="EAGLE", enable_return_hidden_states=True)
    with pytest.raises(ConfigError, match="does not support --enable-return-hidden-states with EAGLE; use EAGLE3."):
        check_model_family(eagle, config, llama)
    # EAGLE-3 captures hidden states in its plain graphs: allowed; so is EAGLE without them.
    check_model_family(NS(speculative_algorithm="EAGLE3", enable_return_hidden_states=True), config, llama)
    check_model_family(NS(speculative_algorithm="EAGLE", enable_return_hidden_states=False), config, llama)


# -- the Engine API: the same flags as ServerArgs keyword arguments ---------------


def engine_kwargs(**extra):
    from conftest import DRAFT

    return dict(model_path=str(TARGET), device="cpu", load_format="dummy", speculative_algorithm="EAGLE3",
                speculative_draft_model_path=str(DRAFT), speculative_num_steps=3, speculative_eagle_topk=1,
                speculative_num_draft_tokens=4, **extra)


def test_engine_keyword_arguments_carry_the_policy(plugins):
    """sglang.Engine(**kwargs) builds ServerArgs(**kwargs) after loading the plugins."""
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(**engine_kwargs(speculative_disable_batch_threshold=5))
    assert get_config(server_args) == PolicyConfig(policy="threshold", threshold=5)
    assert get_config(pickle.loads(pickle.dumps(server_args))).threshold == 5
    alternate = ServerArgs(**engine_kwargs(speculative_switch_policy="alternate",
                                           speculative_switch_alternate_period=3))
    assert get_config(alternate) == PolicyConfig(policy="alternate", alternate_period=3)
    default = get_config(ServerArgs(**engine_kwargs()))
    assert default == PolicyConfig(policy="goodput") and default.implicit
    assert get_config(ServerArgs(**engine_kwargs(speculative_switch_policy="off"))) == PolicyConfig()
    nextn = get_config(ServerArgs(**{**engine_kwargs(), "speculative_algorithm": "NEXTN"}))
    assert nextn == PolicyConfig()


@pytest.mark.parametrize("extra, message", [
    (dict(speculative_disable_batch_threshold=5, speculative_switch_policy="alternate"),
     "--speculative-disable-batch-threshold only applies to the threshold policy, not 'alternate'."),
    (dict(speculative_disable_batch_threshold=5, speculative_eagle_topk=2),
     "--speculative-switch-policy threshold supports --speculative-eagle-topk 1 only (chain drafts), got 2."),
])
def test_engine_keyword_arguments_are_validated_like_the_command_line(plugins, extra, message):
    from sglang.srt.server_args import ServerArgs

    kwargs = {**engine_kwargs(), **extra}
    with pytest.raises(ConfigError) as err:
        ServerArgs(**kwargs)
    assert str(err.value) == "sglang_adaptive: " + message
