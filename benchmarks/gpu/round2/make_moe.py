"""Write a Mixtral-8x7B-shaped MoE model directory (config + local tokenizer, NO weights) for the
two-GPU layout study, served with `--load-format dummy`: vLLM fills every weight with random values
on the GPU at load, so 93 GB of bf16 never has to be written or read from disk.

Shape: hidden 4096, 32 layers, 32 heads / 8 KV heads, 8 experts top-2, expert MLP 14336, vocabulary
cut to 32k as in make_model.py: 46.7 B parameters, 12.9 B active per token. Random (dummy) weights
give a near-flat router, so tokens spread evenly over the experts; real traffic is skewed, which this
model cannot show (it flatters expert parallelism).

    python3 benchmarks/gpu/round2/make_moe.py /tmp/models/mixtral
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

SHAPE = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
             intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None)


def main(out: Path) -> None:
    from autotune.demo_model import write_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_model(Path(tmp) / "demo")
        ids = json.loads((demo / "config.json").read_text())
        out.mkdir(parents=True, exist_ok=True)
        for f in demo.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
                shutil.copy(f, out / f.name)
    config = dict(SHAPE, architectures=["MixtralForCausalLM"], model_type="mixtral", torch_dtype="bfloat16",
                  hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0,
                  output_router_logits=False, router_aux_loss_coef=0.02, initializer_range=0.02,
                  bos_token_id=ids.get("bos_token_id"), eos_token_id=ids.get("eos_token_id"), use_cache=True)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / "config.json")
    print(f"{out}: Mixtral-shaped config (weights: --load-format dummy)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/models/mixtral"))
