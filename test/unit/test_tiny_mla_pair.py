"""The tiny DeepSeek-V3 (MLA + MoE) target and its EAGLE-3 draft that
``test/fixtures/train_tiny_mla_pair.py`` writes: small, loadable by transformers, and
named and shaped the way SGLang 0.5.17 loads them.

The trained weights are not committed (they would push the GPU transfer past its
cap); the GPU host trains them from the script with fixed seeds. These checks run
on a pair the script's own writers produce from a seeded, untrained model: the
same names, shapes and configs, without the training time."""

import json
import re
from pathlib import Path

from conftest import assert_greedy_generation_repeats


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def write_untrained_pair(out: Path) -> Path:
    import sys

    import torch

    sys.path.insert(0, str(FIXTURES))
    import train_tiny_mla_pair as M
    import train_tiny_pair as T

    torch.manual_seed(0)
    from transformers import DeepseekV3ForCausalLM

    cfg = M.target_config(1024)
    M.save_target(DeepseekV3ForCausalLM(cfg).eval(), FIXTURES / "tiny-pair" / "target", out / "target")
    from safetensors.torch import save_file

    (out / "eagle3").mkdir(parents=True)
    save_file(T.Eagle3Draft(cfg).state_dict_for_sglang(), str(out / "eagle3" / "model.safetensors"))
    (out / "eagle3" / "config.json").write_text(json.dumps(M.draft_config(cfg), indent=1))
    return out


PAIR = write_untrained_pair(Path(__import__("tempfile").mkdtemp(prefix="tiny-mla-pair-")))

AUX_LAYER_IDS = [0, 2, 3]


def target_config() -> dict:
    return json.loads((PAIR / "target" / "config.json").read_text())


def checkpoint(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_fits_the_size_budget():
    # ~3.7 MB: the target (~3 MB, bf16) carries its own copy of the tokenizer (54 KB)
    # so SGLang serves it without --tokenizer-path. Made on the GPU host, not committed.
    size = sum(p.stat().st_size for p in PAIR.rglob("*") if p.is_file())
    assert size <= 4_000_000


def test_config_has_the_documented_dims():
    c = target_config()
    assert c["architectures"] == ["DeepseekV3ForCausalLM"] and c["model_type"] == "deepseek_v3"
    assert (c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]) == (1024, 128, 4)
    assert (c["first_k_dense_replace"], c["moe_layer_freq"], c["intermediate_size"]) == (1, 1, 256)
    # MLA
    assert c["num_attention_heads"] == 4 and c["num_attention_heads"] % 2 == 0  # TP 2
    assert (c["q_lora_rank"], c["kv_lora_rank"]) == (64, 256)
    # SGLang's Triton MLA decode kernel takes a latent + rope width of 576 or 288 only
    # (any other fails to compile on the GPU: measured with 64 + 32 = 96).
    assert c["kv_lora_rank"] + c["qk_rope_head_dim"] in (576, 288)
    assert (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]) == (32, 32, 32)
    assert c["rope_interleave"] is True  # SGLang: is_neox_style = not rope_interleave
    assert c["rope_parameters"]["rope_type"] == "default"  # no yarn: SGLang's rope_scaling is None
    assert c.get("rope_scaling") in (None, c["rope_parameters"])
    # MoE
    assert (c["n_routed_experts"], c["num_experts_per_tok"], c["n_shared_experts"]) == (8, 2, 1)
    assert (c["n_group"], c["topk_group"]) == (1, 1)
    assert (c["topk_method"], c["scoring_func"], c["norm_topk_prob"]) == ("noaux_tc", "sigmoid", True)
    assert c["routed_scaling_factor"] == 1.0 and c["hidden_act"] == "silu"
    assert c["moe_intermediate_size"] == 64 and c["moe_intermediate_size"] % 2 == 0  # TP 2
    assert c["n_routed_experts"] >= 2  # SGLang: tp_size <= n_routed_experts
    assert c["tie_word_embeddings"] is True and c["max_position_embeddings"] == 1024


def sglang_params(c: dict) -> set:
    """DeepseekV2ForCausalLM.named_parameters() for this config (TP 1, no fused shared
    expert: SGLang fuses it only for 256/384 routed experts; q_lora_rank set, so
    q_a_proj and kv_a_proj_with_mqa are one fused_qkv_a_proj_with_mqa; tied lm_head)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + "self_attn." + n + ".weight" for n in (
            "fused_qkv_a_proj_with_mqa", "q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj",
            "o_proj")}
        if i < c["first_k_dense_replace"]:
            names |= {p + "mlp.gate_up_proj.weight", p + "mlp.down_proj.weight"}
        else:
            names |= {p + "mlp.gate.weight", p + "mlp.gate.e_score_correction_bias",
                      p + "mlp.experts.w13_weight", p + "mlp.experts.w2_weight",
                      p + "mlp.shared_experts.gate_up_proj.weight",
                      p + "mlp.shared_experts.down_proj.weight"}
    return names


def loader_target(name: str, c: dict, params: set):
    """Where deepseek_weight_loader.do_load_weights puts checkpoint tensor ``name``
    (None: skipped with 'not found in params_dict'). Mirrors its three branches:
    stacked gate/up (not experts), FusedMoE.make_expert_params_mapping, and the rest
    (q_a_proj + kv_a_proj_with_mqa fused when q_lora_rank is set)."""
    for param, weight in (("gate_up_proj", "gate_proj"), ("gate_up_proj", "up_proj")):
        if weight in name:
            if "mlp.experts." in name and name not in params:
                break
            mapped = name.replace(weight, param)
            return mapped if mapped in params else None
    for e in range(c["n_routed_experts"]):
        for weight, param in ((f"experts.{e}.gate_proj.", "experts.w13_"),
                              (f"experts.{e}.up_proj.", "experts.w13_"),
                              (f"experts.{e}.down_proj.", "experts.w2_")):
            if weight in name:
                mapped = name.replace(weight, param)
                if mapped in params:
                    return mapped
    if c.get("q_lora_rank") is not None and ("q_a_proj" in name or "kv_a_proj_with_mqa" in name):
        return re.sub(r"(q_a_proj|kv_a_proj_with_mqa)", "fused_qkv_a_proj_with_mqa", name)
    return name if name in params else None


def test_every_target_tensor_lands_on_an_sglang_parameter_with_the_right_shape():
    import torch

    c = target_config()
    params = sglang_params(c)
    weights = checkpoint(PAIR / "target" / "model.safetensors")
    mapped = {name: loader_target(name, c, params) for name in weights}
    assert not [n for n, m in mapped.items() if m is None]
    assert set(mapped.values()) == params  # and every SGLang parameter gets a weight
    h, heads, inter, moe = c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], \
        c["moe_intermediate_size"]
    nope, rope, v, kv, q = (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"],
                            c["kv_lora_rank"], c["q_lora_rank"])
    shapes = {
        "q_a_proj.weight": (q, h), "q_a_layernorm.weight": (q,), "q_b_proj.weight": (heads * (nope + rope), q),
        "kv_a_proj_with_mqa.weight": (kv + rope, h), "kv_a_layernorm.weight": (kv,),
        "kv_b_proj.weight": (heads * (nope + v), kv), "o_proj.weight": (h, heads * v),
        "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter),
        "gate.weight": (c["n_routed_experts"], h), "e_score_correction_bias": (c["n_routed_experts"],),
        "shared_experts.gate_proj.weight": (moe, h), "shared_experts.down_proj.weight": (h, moe),
    }
    for name, tensor in weights.items():
        if re.search(r"experts\.\d+\.(gate|up)_proj", name):
            assert tuple(tensor.shape) == (moe, h), name
        elif re.search(r"experts\.\d+\.down_proj", name):
            assert tuple(tensor.shape) == (h, moe), name
        else:
            for suffix, shape in shapes.items():
                if name.endswith(suffix) and not (suffix.startswith("mlp.") and "shared" in name):
                    assert tuple(tensor.shape) == shape, name
        if name.endswith("e_score_correction_bias"):
            assert tensor.dtype == torch.float32  # SGLang's MoEGate parameter dtype
        else:
            assert tensor.dtype == torch.bfloat16, name
    assert weights["model.embed_tokens.weight"].shape == (c["vocab_size"], h)
    assert "lm_head.weight" not in weights  # tied


def test_target_loads_with_the_real_hf_loader_and_generates():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PAIR / "target")
    model = AutoModelForCausalLM.from_pretrained(PAIR / "target", dtype=torch.float32).eval()
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    # transformers fuses the per-expert tensors back: the very same numbers.
    weights = checkpoint(PAIR / "target" / "model.safetensors")
    inter = target_config()["moe_intermediate_size"]
    experts = model.model.layers[2].mlp.experts
    expert = "model.layers.2.mlp.experts.5."
    assert torch.equal(experts.gate_up_proj[5, :inter], weights[expert + "gate_proj.weight"].float())
    assert torch.equal(experts.gate_up_proj[5, inter:], weights[expert + "up_proj.weight"].float())
    assert torch.equal(experts.down_proj[5], weights[expert + "down_proj.weight"].float())
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert_greedy_generation_repeats(model, tok)


def test_draft_checkpoint_matches_sglang_eagle3_names_and_the_target():
    config = json.loads((PAIR / "eagle3" / "config.json").read_text())
    c = target_config()
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX_LAYER_IDS
    assert (config["hidden_size"], config["vocab_size"]) == (c["hidden_size"], c["vocab_size"])
    weights = checkpoint(PAIR / "eagle3" / "model.safetensors")
    layer = "layers.0."
    expected = {"fc.weight", "norm.weight", "lm_head.weight"} | {
        layer + name + ".weight" for name in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            "input_layernorm", "hidden_norm", "post_attention_layernorm")}
    # llama_eagle3.load_weights silently skips names it does not know: be exact.
    assert set(weights) == expected
    assert tuple(weights["fc.weight"].shape) == (c["hidden_size"], 3 * c["hidden_size"])
    assert tuple(weights["lm_head.weight"].shape) == (c["vocab_size"], c["hidden_size"])


def test_aux_layer_ids_capture_three_distinct_layers_in_sglang_deepseek():
    """SGLang's DeepSeek rule, read from its source: ids get +1 only when the list
    starts with 1, and layer i's capture is its input (the residual before it runs).
    [0, 2, 3] is taken as is: the inputs of layers 0, 2, 3, all of which exist
    (the training script feeds HF hidden_states[0], [2], [3])."""
    import inspect

    import sglang.srt.models.deepseek_v2 as dsv2

    src = inspect.getsource(dsv2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)
    assert "layer_ids[0] == 1" in src and "val + 1" in src
    captured = [v + 1 for v in AUX_LAYER_IDS] if AUX_LAYER_IDS[0] == 1 else list(AUX_LAYER_IDS)
    assert len(set(captured)) == 3 and max(captured) < target_config()["num_hidden_layers"]
    assert "captured_last_layer_outputs=" in inspect.getsource(dsv2.DeepseekV2Model.forward)

    import sys

    sys.path.insert(0, str(FIXTURES))
    import train_tiny_mla_pair as m

    assert list(m.AUX_LAYER_IDS) == AUX_LAYER_IDS
    assert [m.hf_hidden_index(i) for i in AUX_LAYER_IDS] == captured
