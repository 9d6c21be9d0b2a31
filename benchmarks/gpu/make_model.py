"""Write a Llama-3.1-8B-shaped random-weight model (vocabulary cut to 32k) for the GPU benchmarks.

Weights come from transformers on the GPU (seconds, where numpy would take minutes); the tokenizer is
autotune's demo BPE tokenizer, trained locally, so nothing is downloaded. Output text is noise: the
benchmarks send `ignore_eos` with a fixed number of output tokens.

    python3 benchmarks/gpu/make_model.py /tmp/models/llama8b
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

SHAPE = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
             intermediate_size=14336, vocab_size=32000, max_position_embeddings=8192, rope_theta=500000.0)


def main(out: Path) -> None:
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        from autotune.demo_model import RANDOM_WEIGHTS_NOTE
        from autotune.spec import RANDOM_WEIGHTS_MARKER
        (out / RANDOM_WEIGHTS_MARKER).write_text(RANDOM_WEIGHTS_NOTE)   # a model made before the marker existed
        print(f"{out}: already there")
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from autotune.demo_model import write_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_model(Path(tmp) / "demo")
        ids = json.loads((demo / "config.json").read_text())
        out.mkdir(parents=True, exist_ok=True)
        for f in demo.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(f, out / f.name)
    config = LlamaConfig(**SHAPE, torch_dtype="bfloat16", bos_token_id=ids.get("bos_token_id"),
                         eos_token_id=ids.get("eos_token_id"), tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, max_shard_size="4GB", safe_serialization=True)
    from autotune.demo_model import RANDOM_WEIGHTS_NOTE
    from autotune.spec import RANDOM_WEIGHTS_MARKER
    (out / RANDOM_WEIGHTS_MARKER).write_text(RANDOM_WEIGHTS_NOTE)
    print(f"{out}: {n / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/models/llama8b"))
