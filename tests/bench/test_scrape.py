"""The server's /metrics as a time series (llmrs.bench.scrape): the parser on each exporter's names, the per-run
summary, a server without /metrics. The scraper against a real `llmrs serve` on 127.0.0.1 while a bench runs:
tests/bench/test_bench_graded.py."""

import time

import pytest

from llmrs.bench import scrape

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1024.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
vllm:generation_tokens_total{engine="1",model_name="m"} 60.0
# TYPE process_cpu_seconds counter
process_cpu_seconds_total 12.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.5
"""


def test_each_exporters_names_become_the_same_series():
    assert scrape.parse(VLLM) == {"running": 3.0, "waiting": 5.0, "kv_usage": 0.25, "preemptions": 2.0,
                                  "prefix_queries": 1024.0, "generation_tokens": 100.0}  # engines summed
    assert scrape.parse(SGLANG) == {"running": 7.0, "waiting": 1.0, "kv_usage": 0.5}


def test_the_summary_is_gauges_mean_and_peak_and_counters_increase():
    rows = [{"t": 1.0, "running": 2.0, "waiting": 0.0, "kv_usage": 0.1, "generation_tokens": 10.0},
            {"t": 2.0, "running": 4.0, "waiting": 2.0, "kv_usage": 0.3, "generation_tokens": 50.0},
            {"t": 9.0, "running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "generation_tokens": 90.0}]
    s = scrape.summarize(rows, 0.5, 2.5)
    assert s["polls"] == 2 and s["mean_running"] == 3.0 and s["peak_running"] == 4.0
    assert s["peak_waiting"] == 2.0 and s["peak_kv_usage"] == pytest.approx(0.3)
    # counters over the polls that bracket the run: none before 0.5 (the window's first, 10), the first after 2.5 (90)
    assert s["generation_tokens_delta"] == 80.0 and s["preemptions_delta"] is None
    assert scrape.summarize(rows, 1.5, 2.5)["generation_tokens_delta"] == 80.0  # from t 1.0 (10) to t 9.0 (90)
    assert scrape.summarize(rows, 1.5, 9.5)["generation_tokens_delta"] == 80.0  # nothing after: the window's last
    assert scrape.summarize(rows, 3.0, 4.0) is None


def test_a_server_without_metrics_is_said_once(tmp_path):
    from tests.bench_fixtures.serving import running

    with running() as (url, _stats):
        sc = scrape.Scraper(url, tmp_path / "m.csv", interval_s=0.05).start()
        deadline = time.perf_counter() + 10
        while not sc.why and time.perf_counter() < deadline:
            time.sleep(0.05)
        sc.stop()
    assert sc.why == "the server's /metrics answered 404" and sc.polls == 0
