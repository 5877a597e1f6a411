"""The server's /metrics as a time series (llmrs.bench.scrape): the parser on each exporter's names, and the
scraper against a real `llmrs serve` (the embedded model, CPU) on 127.0.0.1 while requests run."""

import sys
import threading
import time

import openai
import pytest

from llmrs.bench import scrape
from llmrs.bench.server import ManagedServer

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


def test_scraping_a_real_llmrs_serve_while_requests_run(tmp_path):
    cmd = [sys.executable, "-m", "llmrs", "serve", "--device", "cpu", "--max-model-len", "512",
           "--host", "127.0.0.1", "--port", "{port}"]
    with ManagedServer.from_command(cmd, tmp_path / "server.log", startup_timeout=180) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
        model = client.models.list().data[0].id
        made = []

        def one(i: int) -> None:
            r = client.completions.create(model=model, prompt=f"Count to ten, number {i}:", max_tokens=24,
                                          temperature=0, extra_body={"ignore_eos": True})
            made.append(r.usage.completion_tokens)

        with scrape.Scraper(srv.url, tmp_path / "metrics.csv", interval_s=0.1) as sc:
            time.sleep(0.3)
            t0 = time.perf_counter()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.3)  # a poll after the last request finished
            t1 = time.perf_counter()
    assert sc.why == "" and sc.polls >= 3
    rows = scrape.read_rows(tmp_path / "metrics.csv")
    s = scrape.summarize(rows, t0 - 0.3, t1)
    assert made == [24] * 4
    assert s["generation_tokens_delta"] == sum(made)  # every generated token counted by the server
    assert s["peak_running"] >= 1 and s["peak_kv_usage"] > 0
    assert rows[-1]["running"] == 0 and rows[-1]["waiting"] == 0


def test_a_server_without_metrics_is_said_once(tmp_path):
    from tests.bench_fixtures.serving import running

    with running() as (url, _stats):
        sc = scrape.Scraper(url, tmp_path / "m.csv", interval_s=0.05).start()
        deadline = time.perf_counter() + 10
        while not sc.why and time.perf_counter() < deadline:
            time.sleep(0.05)
        sc.stop()
    assert sc.why == "the server's /metrics answered 404" and sc.polls == 0
