"""The committed tiny target/draft pair: small, loadable, and shaped for SGLang."""

import json
from pathlib import Path

from conftest import assert_greedy_generation_repeats

import pytest

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-pair"
pytestmark = pytest.mark.skipif(not (PAIR / "eagle3").exists(), reason="fixture not generated")


def test_fits_the_size_budget():
    size = sum(p.stat().st_size for p in PAIR.rglob("*") if p.is_file())
    assert size <= 3 * 1024 * 1024


def test_target_loads_with_the_real_hf_loader_and_generates():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PAIR / "target")
    model = AutoModelForCausalLM.from_pretrained(PAIR / "target", dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert_greedy_generation_repeats(model, tok)


def test_draft_checkpoint_matches_sglang_eagle3_names():
    from safetensors import safe_open

    config = json.loads((PAIR / "eagle3" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    with safe_open(str(PAIR / "eagle3" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    layer = "layers.0."
    expected = {"fc.weight", "norm.weight", "lm_head.weight"} | {
        layer + name + ".weight" for name in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            "input_layernorm", "hidden_norm", "post_attention_layernorm")}
    # llama_eagle3.load_weights silently skips names it does not know: be exact.
    assert keys == expected



def test_held_out_prompts_come_from_files_the_pair_never_saw():
    import sys

    from tokenizers import Tokenizer

    sys.path.insert(0, str(PAIR.parent))
    import train_tiny_pair as t

    train, heldout = t.stdlib_files()
    assert heldout and not set(train) & set(heldout)
    assert all(p.name >= t.HELDOUT_FROM and p.parent == heldout[0].parent for p in heldout)
    assert not any("site-packages" in p.parts for p in train)  # machine-independent corpus
    # The committed held-out tokens are the start of the held-out text, tokenized by
    # the pair's own tokenizer.
    tok = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    data = (PAIR / "heldout_tokens.bin").read_bytes()
    ids = [int.from_bytes(data[i:i + 2], "little") for i in range(0, 400, 2)]
    assert t.heldout_text().startswith(tok.decode(ids)[:100])


def test_served_tokens_per_verify_walks_accepted_runs():
    import sys

    sys.path.insert(0, str(PAIR.parent))
    from evaluate_tiny_pair import served

    # Run lengths per position (0..3 drafts accepted): verify at 0 accepts 3 (4 tokens),
    # next verify at 4 accepts 0, at 5 accepts 1 (2 tokens), then 7.
    assert served([3, 9, 9, 9, 0, 1, 9, 2]) == (4 + 1 + 2 + 3, 4)
