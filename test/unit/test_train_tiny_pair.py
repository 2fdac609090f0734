"""The draft's unrolled training step equals drafting one position at a time.

SGLang drafts incrementally: draft-extend writes step-0 keys for every verified
position, then each draft step at position p attends to those (j <= p) and to the
keys its own earlier steps wrote at p. ``Eagle3Draft.unroll`` computes all
positions and steps at once with a mask; this checks it against a plain loop.
"""

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import train_tiny_pair as t  # noqa: E402


def incremental(draft, embeds, aux, p, steps):
    """Logits of steps 0..steps-1 at position p, one query at a time."""
    n = p + 1
    pos = torch.arange(n)
    hidden0 = draft.fc(aux[:, :n])
    _, k0, v0 = draft.qkv(embeds[:, 1:n + 1], hidden0, pos)
    keys, values, out, logits = [k0], [v0], None, []
    for k in range(steps):
        if k == 0:
            hidden = hidden0[:, p:p + 1]
            q, _, _ = draft.qkv(embeds[:, 1 + p:2 + p], hidden, pos[p:p + 1])
        else:
            hidden = out
            q, kk, vv = draft.qkv(embeds[:, 1 + p + k:2 + p + k], hidden, pos[p:p + 1] + k)
            keys.append(kk)
            values.append(vv)
        key = torch.cat(keys, 2)
        value = torch.cat(values, 2)
        scores = (q @ key.transpose(-1, -2)) / math.sqrt(draft.hd)
        logit, out = draft.finish(F.softmax(scores, -1) @ value, hidden)
        logits.append(logit[:, 0])
    return logits


def test_unrolled_draft_steps_equal_incremental_drafting():
    torch.manual_seed(0)
    cfg = t.target_config(64)
    draft = t.Eagle3Draft(cfg).double()
    embeds = torch.randn(2, 12, cfg.hidden_size, dtype=torch.double)
    aux = torch.randn(2, 12, cfg.hidden_size * len(t.AUX_LAYERS), dtype=torch.double)
    steps = 3
    logits, n = draft.unroll(embeds, aux, steps)
    assert n == 9
    for p in (0, 4, n - 1):
        expected = incremental(draft, embeds, aux, p, steps)
        for k in range(steps):
            torch.testing.assert_close(logits[k][:, p], expected[k])


def test_checkpoint_names_follow_sglang_eagle3():
    names = set(t.Eagle3Draft(t.target_config(64)).state_dict_for_sglang())
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    assert "layers.0.hidden_norm.weight" in names and "lm_head.weight" in names
    assert not any(n.startswith(("q_proj", "gate_proj")) for n in names)
