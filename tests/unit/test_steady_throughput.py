"""Output tokens/s over the fully-loaded window of a run, against a whole-run average."""

from autotune.bench.metrics import steady_output_throughput, summarize
from autotune.bench.results import RequestRecord


def request(start: float, tokens: int = 10, gap_ms: float = 10.0) -> RequestRecord:
    # first token 10 ms after the start, then one token every gap_ms: 100 ms for 10 tokens
    return RequestRecord(start_s=start, ttft_ms=10.0, e2el_ms=10.0 + gap_ms * (tokens - 1),
                         itl_ms=[gap_ms] * (tokens - 1), input_tokens=5, output_tokens=tokens, ok=True)


def test_a_partial_last_wave_does_not_drag_the_steady_figure() -> None:
    # two slots, three requests: the third runs alone after the first wave; the server's rate while
    # both slots were busy is 2 x 10 tokens / 0.1 s = 200 tok/s
    records = [request(0.0), request(0.0), request(0.1)]
    assert abs(steady_output_throughput(records, t0=0.0) - 200.0) < 1e-6
    assert abs(summarize(records, duration_s=0.2)["output_throughput"] - 150.0) < 1e-6   # 30 tokens / 0.2 s


def test_chunks_carrying_several_tokens_count_them_all() -> None:
    # 10 tokens in 5 chunks, two slots, a second wave: still 200 tok/s while loaded
    r = [RequestRecord(start_s=s, ttft_ms=20.0, e2el_ms=100.0, itl_ms=[20.0] * 4, input_tokens=5,
                       output_tokens=10, ok=True) for s in (0.0, 0.0, 0.1, 0.1)]
    assert abs(steady_output_throughput(r, t0=0.0) - 200.0) < 1e-6


def test_failed_requests_add_no_tokens_and_a_window_shorter_than_a_request_gives_none() -> None:
    failed = RequestRecord(start_s=0.05, ttft_ms=None, e2el_ms=None, itl_ms=[], input_tokens=0,
                           output_tokens=0, ok=False, error="HTTP 500")
    assert abs(steady_output_throughput([request(0.0), request(0.0), request(0.1), failed], 0.0) - 200.0) < 1e-6
    assert steady_output_throughput([request(0.0), request(0.0)], t0=0.0) is None   # one wave: no window
    assert steady_output_throughput([failed], t0=0.0) is None
