"""Re-judge run 1's bf16 configurations under the suite's final bf16 rule, from the
divergences recorded in run1-gpu-suite-tiny-pair.json (no GPU needed).

Run 1 judged bf16 against the noise of two no-spec servers alone (6 of 200
requests) and failed every configuration, upstream's static EAGLE-3 included. The
final rule (test/gpu/test_tiny_pair.py: bf16_noise, bf16_violations) takes the noise
of upstream's unmodified paths: a second no-spec server and static EAGLE-3.

    python benchmark/results/2026-11-30-h200-test-strength/rejudge_bf16.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "test" / "gpu"))
from test_tiny_pair import BF16_COUNT_SLACK, BF16_STEP, GAP_EPS  # noqa: E402

configs = json.loads((Path(__file__).parent / "run1-gpu-suite-tiny-pair.json").read_text())["configs"]
noise = [configs["plain-2"]["noise_divergences"], configs["eagle3"]["divergences"]]
gaps = [d[2] for div in noise for d in div]
bound = max(gaps) + min((g for g in gaps if g > 0), default=BF16_STEP)
most = max(len(div) for div in noise)
print(f"noise: second no-spec server {len(noise[0])}, static EAGLE-3 {len(noise[1])} diverging requests; "
      f"gap bound {bound:.4f} nats, count bound {BF16_COUNT_SLACK * most:.1f}")
for label, entry in configs.items():
    if "~" in label or "fp32" in label or "divergences" not in entry or label == "eagle3":
        continue
    div = entry["divergences"]
    worst = max((d[2] for d in div), default=0.0)
    ok = worst <= bound + GAP_EPS and len(div) <= BF16_COUNT_SLACK * most
    print(f"{label:28s} {len(div):3d} diverging, largest gap {worst:.4f}: {'pass' if ok else 'FAIL'}")
for label, entry in configs.items():
    if "~" in label and "fp32" not in label and "divergences" in entry:
        div = entry["divergences"]
        caught = len(div) > BF16_COUNT_SLACK * most or max((d[2] for d in div), default=0) > bound + GAP_EPS
        print(f"{label:45s} {len(div):3d} diverging: {'caught' if caught else 'SURVIVED'}")
