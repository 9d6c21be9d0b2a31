"""The memory model: vLLM's KV sizing, the articles' KV token counts, and the startup failures."""

import pytest

from autotune import causes
from autotune.perfmodel import plan, predict_launch
from autotune.perfmodel.memory import capture_sizes
from autotune.perfmodel.profiles import load_profile

GLM53 = ["--tensor-parallel-size", "8", "--max-model-len", "1048576"]


@pytest.mark.parametrize("gmu, seqs, expected", [("0.90", "256", 1_535_933), ("0.95", "32", 2_004_983)])
def test_glm53_on_8xa800_reproduces_article_kv_tokens(gmu, seqs, expected):
    p = plan("glm-5.3-flash", GLM53 + ["--gpu-memory-utilization", gmu, "--max-num-seqs", seqs], "A800", 8)
    assert p.budget.fits
    assert abs(p.budget.kv_cache_tokens - expected) / expected < 0.10
    assert p.budget.weights_gib == pytest.approx(39.8, abs=0.2)   # seed 001: 39.8 GiB/card


def test_glm53_on_four_gpus_does_not_fit_weights():
    """Seed 001: at 4 cards the weights alone exceed a card."""
    p = plan("glm-5.3-flash", ["--tensor-parallel-size", "4", "--max-model-len", "1048576"], "A800", 8)
    assert not p.budget.fits and p.budget.cause == causes.STARTUP_OOM
    assert "CUDA out of memory" in p.budget.reason


def test_kv_smaller_than_one_request_fails_like_vllm():
    p = plan("llama-3.1-8b", ["--gpu-memory-utilization", "0.25", "--max-model-len", "131072"], "H100", 1)
    assert not p.budget.fits and p.budget.cause == causes.KV_TOO_SMALL
    assert p.budget.reason.startswith("ValueError: To serve at least one request with the model's max seq len (131072)")
    assert "estimated maximum model length is" in p.budget.reason


def test_budget_below_weights_leaves_no_kv():
    p = plan("llama-3.1-70b", ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.85"], "H100", 2)
    assert p.budget.kv_gib < 0
    assert not p.budget.fits and p.budget.cause == causes.KV_TOO_SMALL
    assert "No available memory for the cache blocks" in p.budget.reason


def test_kv_tokens_follow_the_budget_arithmetic():
    b = plan("glm-4.6v-9b", ["--max-model-len", "4096"], "H100", 1).budget
    kv = b.requested_gib - b.weights_gib - b.activation_gib - b.non_torch_gib - b.graphs_gib
    assert b.kv_gib == pytest.approx(kv)
    assert b.kv_bytes_per_token == 2 * 40 * 4 * 128 * 2          # the article's 80 KB/token
    assert b.kv_cache_tokens == pytest.approx(kv * 2**30 / b.kv_bytes_per_token, abs=16)


def test_knobs_move_memory_the_right_way():
    base = ["--max-model-len", "4096"]
    b = plan("glm-4.6v-9b", base, "H100", 1).budget
    more_tokens = plan("glm-4.6v-9b", base + ["--max-num-batched-tokens", "32768"], "H100", 1).budget
    fewer_seqs = plan("glm-4.6v-9b", base + ["--max-num-seqs", "32"], "H100", 1).budget
    fp8_kv = plan("glm-4.6v-9b", base + ["--kv-cache-dtype", "fp8"], "H100", 1).budget
    assert more_tokens.activation_gib > b.activation_gib
    assert fewer_seqs.graphs_gib < b.graphs_gib and fewer_seqs.kv_cache_tokens > b.kv_cache_tokens
    assert fp8_kv.kv_cache_tokens == pytest.approx(2 * b.kv_cache_tokens, rel=0.01)


def test_fp8_weights_free_memory_for_kv_on_the_moe():
    flags = ["--tensor-parallel-size", "8", "--max-model-len", "32768"]
    bf16 = plan("glm-4.6v-106b", flags, "H100", 8).budget
    fp8 = plan("glm-4.6v-106b", flags + ["--quantization", "fp8"], "H100", 8).budget
    embed_gib = load_profile("glm-4.6v-106b").embedding_params * 2 / 8 / 2**30   # BF16 either way
    assert fp8.weights_gib == pytest.approx((bf16.weights_gib - embed_gib) / 2 + embed_gib)
    assert fp8.kv_cache_tokens > bf16.kv_cache_tokens


def test_expert_parallel_spreads_experts_over_dp():
    tp4 = plan("glm-4.6v-106b", ["-tp", "4", "-q", "fp8"], "H100", 8).budget
    tp4ep2 = plan("glm-4.6v-106b", ["-tp", "4", "-dp", "2", "--enable-expert-parallel", "-q", "fp8"], "H100", 8).budget
    assert tp4ep2.weights_gib < 0.6 * tp4.weights_gib


@pytest.mark.parametrize("flags, gpus, words", [
    (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], 1, "greater than or equal to max_num_seqs"),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048", "--max-model-len", "8192"], 1,
     "smaller than max_model_len"),
    (["--tensor-parallel-size", "3"], 4, "divisible by tensor parallel size"),
    (["--max-model-len", "999999"], 1, "greater than the derived max_model_len"),
    (["--tensor-parallel-size", "2"], 1, "larger than the number of available GPUs"),
])
def test_config_errors_are_bad_config(flags, gpus, words):
    b = plan("llama-3.1-8b", flags, "H100", gpus).budget
    assert not b.fits and b.cause == causes.BAD_CONFIG and words in b.reason


def test_capture_sizes_match_vllm():
    assert capture_sizes(256, False) == 51 and capture_sizes(32, False) == 11 and capture_sizes(256, True) == 0


def test_predict_launch_contract(tmp_path):
    pred = predict_launch("glm-4.6v-9b", ["--gpu-memory-utilization", "0.3", "--max-model-len", "131072"], "H100", 1)
    assert pred is not None and not pred.fits and pred.cause == causes.KV_TOO_SMALL and "\n" not in pred.reason
    ok = predict_launch("glm-4.6v-9b", ["--max-model-len", "4096"], "H100", 1)
    assert ok is not None and ok.fits and ok.kv_cache_tokens > 0 and ok.max_concurrency > 1
    assert predict_launch("glm-4.6v-9b", [], None, 1) is None            # CPU host: no GPU
    assert predict_launch(str(tmp_path / "nope"), [], "H100", 1) is None  # unknown model
    cfg = tmp_path / "config.json"
    cfg.write_text('{"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2, '
                   '"intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 2048}')
    tiny = predict_launch(str(tmp_path), ["--max-model-len", "1024"], "L40S", 1)
    assert tiny is not None and tiny.fits and tiny.weights_gib_per_gpu < 0.01
