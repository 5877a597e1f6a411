"""Unit behaviour of `llmrs bench`'s pieces: SSE parsing, arrivals, cap splitting, SLO/sweep parsing, workloads."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from llmrs.bench.arrivals import arrival_offsets
from llmrs.bench.bench import BenchOptions, _few_prompts_warning, parse_sweep, sweep_points
from llmrs.bench.dataset import WorkloadConfig, build_workload
from llmrs.bench.metrics import parse_slo, peak_concurrency
from llmrs.bench.records import RequestResult
from llmrs.bench.runner import plan_workers, split_cap
from llmrs.bench.server import llmrs_serve_argv
from llmrs.bench.sse import SSEParser
from llmrs.bench.tokenization import LocalTokenizer
from llmrs.errors import UserError


def test_sse_parser_handles_events_split_anywhere_and_crlf():
    stream = b'data: {"a":1}\r\n\r\n: comment\n\ndata: {"b":2}\n\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n'
    for step in (1, 3, 7, len(stream)):
        p = SSEParser()
        got = [e for i in range(0, len(stream), step) for e in p.feed(stream[i : i + step])]
        assert got == [b'{"a":1}', b'{"b":2}', b"line1\nline2", b"[DONE]"], step


def test_sse_parser_flush_returns_unterminated_last_event():
    p = SSEParser()
    assert p.feed(b'data: {"x":1}') == []
    assert p.flush() == [b'{"x":1}']


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_gamma_arrivals_have_requested_mean_rate(burstiness):
    rate, n = 20.0, 20000
    t = arrival_offsets(n, rate, burstiness, seed=123)
    gaps = np.diff(t)
    assert t[0] == 0 and np.all(gaps >= 0)
    # mean gap 1/rate within 3 standard errors (std of a gamma gap: 1/(rate*sqrt(burstiness)))
    se = 1 / (rate * math.sqrt(burstiness)) / math.sqrt(n - 1)
    assert abs(gaps.mean() - 1 / rate) < 3 * se
    # coefficient of variation is 1/sqrt(burstiness): 1 for Poisson
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_rate_sends_all_at_once_and_bad_rates_are_rejected():
    assert np.all(arrival_offsets(5, math.inf) == 0)
    with pytest.raises(ValueError):
        arrival_offsets(5, 0.0)


def test_cap_split_over_workers_sums_to_cap_and_workers_never_exceed_slots():
    assert split_cap(10, 3) == [4, 3, 3]
    assert sum(split_cap(257, 8)) == 257
    assert split_cap(None, 2) == [None, None]
    assert plan_workers(n_requests=100, cap=3, workers=8) == 3
    assert plan_workers(n_requests=2, cap=None, workers=8) == 2


def test_peak_concurrency_from_intervals():
    rs = [RequestResult(0, start=0, end=2), RequestResult(1, start=1, end=3), RequestResult(2, start=2, end=4), RequestResult(3, start=2.5, end=2.6)]
    assert peak_concurrency(rs) == 3  # at t=2.5: 1, 2, 3 (0 ended exactly at 2)


def test_slo_and_sweep_parsing():
    assert parse_slo("ttft=200,tpot=50") == {"ttft": 200.0, "tpot": 50.0}
    with pytest.raises(ValueError):
        parse_slo("latency=3")
    assert parse_sweep("concurrency=1,16,64") == ("concurrency", [1.0, 16.0, 64.0])
    assert parse_sweep("request-rate=2,inf") == ("request_rate", [2.0, math.inf])
    with pytest.raises(UserError):
        parse_sweep("batch=1,2")
    o = BenchOptions(concurrency=8, sweep=("request_rate", [1.0, math.inf]))
    assert sweep_points(o) == [(8, 1.0), (8, math.inf)]


def test_default_server_is_llmrs_serve_on_loopback_with_port_placeholder():
    argv = llmrs_serve_argv("my-model")
    assert argv[1:5] == ["-m", "llmrs", "serve", "my-model"]
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "{port}"]
    assert "serve" in llmrs_serve_argv(None) and len(llmrs_serve_argv(None)) == len(argv) - 1


def _tiny_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<bos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["the quick brown fox jumps over the lazy dog, again and again; 12345 cafe"] * 50, trainer)
    tk.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def test_random_text_prompts_tokenize_to_exact_length_with_local_tokenizer(tmp_path):
    tok = LocalTokenizer(_tiny_tokenizer(tmp_path))
    cfg = WorkloadConfig(num_prompts=30, input_len=64, output_len=16, range_ratio=0.5, prefix_len=8, seed=7)
    specs = asyncio.run(build_workload(cfg, tok))
    lens = [len(tok.tok.encode(s.prompt).ids) for s in specs]
    assert lens == [s.input_len for s in specs]
    hit = sum(1 for s in specs if 8 + 32 <= s.input_len <= 8 + 96)
    assert hit == 30
    # deterministic for a seed
    again = asyncio.run(build_workload(cfg, tok))
    assert [s.prompt for s in again] == [s.prompt for s in specs]


def test_token_id_prompts_need_no_tokenizer_and_chat_rejects_them():
    specs = asyncio.run(build_workload(WorkloadConfig(num_prompts=4, input_len=10, prompt_format="ids"), None))
    assert all(isinstance(s.prompt, list) and len(s.prompt) == 10 == s.input_len for s in specs)
    with pytest.raises(UserError):
        asyncio.run(build_workload(WorkloadConfig(prompt_format="ids", backend="chat"), None))
    with pytest.raises(UserError, match="tokenizer"):
        asyncio.run(build_workload(WorkloadConfig(num_prompts=2), None))


def test_sharegpt_and_jsonl_datasets(tmp_path):
    share = tmp_path / "sg.json"
    share.write_text('[{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}]')
    specs = asyncio.run(build_workload(WorkloadConfig(num_prompts=3, dataset=str(share)), None))
    assert [s.prompt for s in specs] == ["hi there"] * 3 and specs[0].output_len == 128
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a b", "output_len": 5}\n"just text"\n{"prompt": [1, 2, 3]}\n')
    specs = asyncio.run(build_workload(WorkloadConfig(num_prompts=3, dataset=str(jl), seed=1), None))
    assert sorted(map(str, (s.prompt for s in specs))) == sorted(["a b", "just text", "[1, 2, 3]"])
    assert {s.output_len for s in specs if s.prompt == "a b"} == {5}
    with pytest.raises(UserError):
        asyncio.run(build_workload(WorkloadConfig(dataset=str(tmp_path / "missing.json")), None))


def test_prefix_cache_counters_from_llmrs_and_vllm_metrics():
    """`llmrs bench` reads the server's prefix-cache counters around each run (llmrs's and vLLM's names, `_total`
    or not, summed over label sets) and saves what the run added: hits mean the server had seen the prompts."""
    from llmrs.bench.sysinfo import metric_totals, prefix_cache_delta, prefix_cache_from

    vllm = ('# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n'
            '# TYPE vllm:prefix_cache_queries_total counter\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1024.0\n'
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1024.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 512.0\n'
            'vllm:num_requests_running{model_name="m"} 3.0\n')
    assert prefix_cache_from(metric_totals(vllm)) == {"source": "vllm", "queries": 2048.0, "hits": 512.0,
                                                      "preemptions": None}
    llmrs = ('llmrs:prefix_cache_queries_total{model_name="x"} 96.0\nllmrs:prefix_cache_hits_total{model_name="x"} 0.0\n'
             'llmrs:num_preemptions_total{model_name="x"} 2.0\n')
    assert prefix_cache_from(metric_totals(llmrs)) == {"source": "llmrs", "queries": 96.0, "hits": 0.0,
                                                       "preemptions": 2.0}
    assert prefix_cache_from(metric_totals("sglang:cache_hit_rate 0.5\n")) is None
    before = {"source": "vllm", "queries": 100.0, "hits": 0.0}
    after = {"source": "vllm", "queries": 612.0, "hits": 256.0}
    assert prefix_cache_delta(before, after) == {"source": "vllm", "query_tokens": 512, "hit_tokens": 256,
                                                 "hit_rate": 0.5, "preemptions": None}
    assert prefix_cache_delta(None, after) is None


def test_prefix_cache_hits_are_told_apart_from_recomputation_after_preemption():
    """Prompts of 512 tokens in all; lookups beyond them come from readmissions after preemption. Hits within those
    extra lookups are recomputation; hits beyond them can only be prompts seen before; with no preemption every hit
    is a prompt seen before."""
    from llmrs.bench.sysinfo import prefix_cache_delta, prefix_cache_notes

    before = {"source": "llmrs", "queries": 0.0, "hits": 0.0, "preemptions": 5.0}

    def delta(queries, hits, preempted):
        after = {"source": "llmrs", "queries": queries, "hits": hits, "preemptions": 5.0 + preempted}
        return prefix_cache_delta(before, after, prompt_tokens=512)

    recompute = delta(1024, 300, 3)
    assert recompute["requery_tokens"] == 512 and recompute["hit_tokens_seen_before"] == 0
    pre, note = prefix_cache_notes(recompute)
    assert "preempted 3 request(s)" in pre
    assert "all within the 512 tokens looked up again" in note and "not prompts it had seen before" in note
    mixed = delta(600, 200, 1)
    assert mixed["requery_tokens"] == 88 and mixed["hit_tokens_seen_before"] == 112
    assert "at least 112 tokens were prompts" in prefix_cache_notes(mixed)[1]
    assert "the other 88 are within" in prefix_cache_notes(mixed)[1]
    seen = delta(512, 256, 0)
    assert seen["hit_tokens_seen_before"] == 256
    (note,) = prefix_cache_notes(seen)
    assert "(no request was preempted): it had seen these prompts" in note
    assert prefix_cache_notes(delta(512, 0, 0)) == []


def test_client_cpu_reads_as_a_share_of_one_core_per_worker():
    """It read "1: 0%" (a worker count and a rounded share that looked like worker 1 at zero)."""
    from rich.console import Console

    from llmrs.bench.console import summary_table
    from llmrs.bench.metrics import summarize

    s = summarize([], 0.0)
    console = Console(record=True, width=200)
    console.print(summary_table("t", s, {"workers": 1, "busy_per_worker": [0.004]}))
    console.print(summary_table("t", s, {"workers": 2, "busy_per_worker": [0.31, 0.052]}))
    text = console.export_text()
    assert "Client CPU (share of one core, 1 worker)" in text and "0.4%" in text
    assert "Client CPU (share of one core, 2 workers)" in text and "31%, 5.2%" in text


def test_graph_capture_failures_from_an_llmrs_servers_metrics():
    from llmrs.bench.sysinfo import graph_capture_failures, metric_totals

    text = ('# TYPE llmrs:cuda_graph_capture_failures_total counter\n'
            'llmrs:cuda_graph_capture_failures_total{model_name="m"} 27.0\n'
            'llmrs:cuda_graph_captures_total{model_name="m"} 1.0\n')
    assert graph_capture_failures(metric_totals(text)) == 27
    assert graph_capture_failures(metric_totals('vllm:num_requests_running{model_name="m"} 0.0\n')) is None
    assert graph_capture_failures(None) is None


def test_a_server_vocabulary_smaller_than_the_id_range_is_found_and_used():
    """Random prompts draw ids from dataset.ID_RANGE; a server whose /detokenize refuses ids past its vocabulary
    (400 here, a test model's) gets them from [256, 400) instead (bisection over /detokenize); its errors on a
    tokenizer call come back as one UserError line, not an HTTP traceback."""
    import httpx

    from llmrs.bench.dataset import ID_RANGE, id_range
    from llmrs.bench.tokenization import ServerTokenizer, probe_server_tokenizer

    vocab, calls = 400, []

    def handler(request: httpx.Request) -> httpx.Response:
        body = __import__("json").loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [300, 301], "count": 2})
        calls.append(body["tokens"])
        if any(not 0 <= t < vocab for t in body["tokens"]):
            return httpx.Response(400, json={"error": {"message": "token id outside the vocabulary"}})
        return httpx.Response(200, json={"prompt": "x" * len(body["tokens"])})

    async def probe(h):
        async with httpx.AsyncClient(transport=httpx.MockTransport(h)) as client:
            return await probe_server_tokenizer("http://srv", "m", client)

    tok = asyncio.run(probe(handler))
    assert tok is not None and tok.vocab_size == vocab and len(calls) < 25  # ~log2(32000) probes
    assert id_range(tok.vocab_size) == (256, vocab) and id_range(None) == ID_RANGE == id_range(10**6)
    assert id_range(300) == (150, 300)  # too few ids above 256: the upper half
    vocab = 10**6  # a large vocabulary: /detokenize takes the whole range, nothing to cut
    assert asyncio.run(probe(handler)).vocab_size is None

    async def failing():
        def h(request):
            return httpx.Response(503, text="engine down")
        async with httpx.AsyncClient(transport=httpx.MockTransport(h)) as client:
            await ServerTokenizer("http://srv", "m", client).decode([1])

    with pytest.raises(UserError, match="/detokenize answered 503: engine down"):
        asyncio.run(failing())


def test_a_given_prompt_count_below_a_cap_is_warned_about_and_a_sized_one_is_not():
    """-n N is every run's count, and a run whose cap is above it can never fill its slots: a warning names them.
    Without -n each run is sized by its probe (test_bench_sizing.py), which says itself when the cap is not reached."""
    auto = BenchOptions(workload=WorkloadConfig(num_prompts=1), sweep=("concurrency", [1, 16, 64, 256]),
                        auto_num_prompts=True)
    assert _few_prompts_warning(auto) is None
    given = BenchOptions(workload=WorkloadConfig(num_prompts=50), sweep=("concurrency", [1, 64, 256]))
    assert [c for c, _ in sweep_points(given)] == [1, 64, 256]
    assert _few_prompts_warning(given) == ("warning: -n 50 is less than concurrency 64, 256: at most 50 requests "
                                           "are ever in flight; give -n 256 or more to fill every slot")


def test_interrupts_cancel_coroutines_defer_in_runs_and_raise_on_the_second_signal(capfd):
    """SIGTERM while a coroutine runs: it is cancelled (its cleanup runs) and Interrupted(SIGTERM) comes out, with no
    "Task exception was never retrieved" noise; inside deferred() the first signal is only noted, a second raises;
    the previous handlers are back afterwards."""
    import os
    import signal
    import threading

    from llmrs.bench.interrupts import Interrupted, Interrupts

    cleaned = []

    async def slow():
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with Interrupts() as intr:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(Interrupted) as e:
            intr.run(slow())
        assert e.value.signum == signal.SIGTERM and e.value.exit_code == 143 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before
    with Interrupts() as intr, pytest.raises(Interrupted) as e:
        with intr.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            assert intr.signum == signal.SIGHUP  # noted, not raised
            os.kill(os.getpid(), signal.SIGINT)
    assert e.value.signum == signal.SIGINT
    assert "never retrieved" not in capfd.readouterr().err
