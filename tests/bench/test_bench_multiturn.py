"""Multi-turn conversations against the exact-timing fake server (tests/bench_fixtures): each turn carries the
history so far (earlier user messages and the server's actual replies), is sent after the previous answer plus the
think time, and its TTFT is recorded per turn."""

from __future__ import annotations

import json

import httpx
import pandas as pd
import pytest
from rich.console import Console

from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.dataset import WorkloadConfig
from llmrs.errors import UserError
from tests.bench_fixtures.serving import running

MS = 1e-3
TOL = 15 * MS  # loopback + event-loop timers + OS scheduling on a shared 2-core box
THINK = 0.2


@pytest.fixture(scope="module")
def server():
    with running() as (url, stats):
        yield url, stats


def _msg(c: int, k: int, extra: str = "") -> str:
    return f"conv{c} turn{k} reply=r{c}x{k} n=3 ttft_ms={30 + 20 * k}{extra}"


def _sharegpt(path, convs) -> str:
    data = [{"id": str(c), "conversations": [x for k, m in enumerate(msgs) for x in
                                               ({"from": "human", "value": m}, {"from": "gpt", "value": "a b c"})]}
            for c, msgs in enumerate(convs)]
    path.write_text(json.dumps(data))
    return str(path)


def _run(url, tmp_path, name, **kw):
    o = BenchOptions(url=url, out_dir=tmp_path, name=name, **{"concurrency": None, "workers": 2, **kw})
    console = Console(record=True, width=220)
    doc = json.loads(run_bench(o, console).read_text())
    return doc, console.export_text()


def test_each_turn_carries_the_history_and_follows_the_answer_after_the_think_time(server, tmp_path):
    url, stats = server
    httpx.post(f"{url}/stats/reset", trust_env=False)
    convs = [[_msg(c, k) for k in range(3)] for c in range(2)]
    ds = _sharegpt(tmp_path / "sg.json", convs)
    wl = WorkloadConfig(num_prompts=2, dataset=ds, multi_turn=True, backend="chat", output_len=3)
    doc, text = _run(url, tmp_path, "mt", workload=wl, think_time=THINK)
    (run,) = doc["runs"]
    assert run["mode"] == "multi-turn" and run["multi_turn"] == {
        "conversations": 2, "requests": 6, "turns_mean": 3.0, "turns_max": 3, "think_time_s": THINK}
    s = run["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    seen = stats.get()
    for c in range(2):
        history = []
        for k in range(3):
            msg = _msg(c, k)
            assert seen["messages"][msg] == history + [{"role": "user", "content": msg}]
            history += [{"role": "user", "content": msg}, {"role": "assistant", "content": f" r{c}x{k}" * 3}]
            if k:  # sent the think time after the previous answer's last chunk
                prev_end, arrive = seen["timings"][_msg(c, k - 1)][-1], seen["timings"][msg][0]
                assert arrive - prev_end == pytest.approx(THINK, abs=TOL)
    csv = pd.read_csv(tmp_path / run["csv"])
    assert sorted(zip(csv["conversation"], csv["turn"])) == [(c, k) for c in range(2) for k in range(3)]
    per_turn = s["per_turn"]
    assert [t["turn"] for t in per_turn] == [0, 1, 2] and all(t["completed"] == 2 for t in per_turn)
    for t in per_turn:  # each turn's own server-side TTFT (ttft_ms directive: 30, 50, 70 ms)
        assert t["ttft_ms"]["median"] == pytest.approx(30 + 20 * t["turn"], abs=TOL / MS)
        assert t["queued_ttft_ms"]["median"] >= t["ttft_ms"]["median"]
    # a turn's scheduled send is the previous answer's end + the think time: no queueing on top
    for _, r in csv[csv["turn"] > 0].iterrows():
        prev = csv[(csv["conversation"] == r["conversation"]) & (csv["turn"] == r["turn"] - 1)].iloc[0]
        assert r["scheduled_s"] == pytest.approx(prev["end_s"] + THINK, abs=1e-5)
    assert "TTFT turn 2 (2 req" in text and "multi-turn: 2 conversations, 6 turns" in text
    assert doc["params"]["mode"] == "multi-turn" and doc["params"]["think_time_s"] == THINK


def test_random_conversations_grow_by_one_exchange_a_turn(server, tmp_path):
    url, stats = server
    httpx.post(f"{url}/stats/reset", trust_env=False)
    wl = WorkloadConfig(num_prompts=3, input_len=10, output_len=2, multi_turn=True, turns=3, backend="chat", seed=5)
    doc, _ = _run(url, tmp_path, "rand", workload=wl, concurrency=2)
    (run,) = doc["runs"]
    assert run["summary"]["completed"] == 9 and run["multi_turn"]["conversations"] == 3
    carried = list(stats.get()["messages"].values())
    assert sorted(len(m) for m in carried) == [1, 1, 1, 3, 3, 3, 5, 5, 5]
    for m in carried:
        assert [x["role"] for x in m] == ["user", "assistant"] * (len(m) // 2) + ["user"]
        assert all(x["content"] == " tok tok" for x in m if x["role"] == "assistant")  # the server's replies
    csv = pd.read_csv(tmp_path / run["csv"])
    assert (csv["input_len"][csv["turn"] == 0] == 10).all()  # each user message exactly --input-len tokens
    # later turns' prompts hold the history: estimated as the previous prompt + its answer + the new message
    grown = csv.pivot(index="conversation", columns="turn", values="input_len")
    assert (grown[1] > grown[0]).all() and (grown[2] > grown[1]).all()
    assert run["summary"]["peak_concurrency"] <= 2  # --concurrency: conversations at once


def test_a_failed_turn_ends_its_conversation(server, tmp_path):
    url, _ = server
    convs = [[_msg(0, 0), _msg(0, 1, " fault=500"), _msg(0, 2)], [_msg(1, k) for k in range(2)]]
    wl = WorkloadConfig(num_prompts=2, dataset=_sharegpt(tmp_path / "f.json", convs), multi_turn=True,
                        backend="chat", output_len=3)
    doc, _ = _run(url, tmp_path, "fail", workload=wl)
    s = doc["runs"][0]["summary"]
    assert s["completed"] == 3 and s["failed"] == 2
    assert s["failures"] == {"HTTP 500": 1, "skipped": 1}
    csv = pd.read_csv(tmp_path / doc["runs"][0]["csv"])
    skipped = csv[csv["error"].fillna("").str.startswith("skipped")]
    assert list(skipped["turn"]) == [2] and skipped["error"].iloc[0] == "skipped: turn 1 of this conversation failed"


def test_multi_turn_options_that_do_not_fit_are_refused(tmp_path):
    url = "http://127.0.0.1:9"  # refused before any request: nothing listens there
    quiet = Console(quiet=True)
    with pytest.raises(UserError, match="give --turns N"):
        run_bench(BenchOptions(url=url, workload=WorkloadConfig(multi_turn=True, backend="chat")), quiet)
    with pytest.raises(UserError, match="--think-time applies to multi-turn"):
        run_bench(BenchOptions(url=url, think_time=1.0), quiet)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "prompt": "x"}\n')
    with pytest.raises(UserError, match="a trace replay is not multi-turn"):
        run_bench(BenchOptions(url=url, workload=WorkloadConfig(multi_turn=True, dataset=str(trace))), quiet)


def test_cli_multi_turn_against_llmrs_serve_shows_history_reuse(tmp_path):
    """`llmrs bench --turns 3` against the `llmrs serve` it starts: chat conversations whose later turns resend the
    history; the server's prefix cache finds it (history_hit_tokens), which is reuse, not a contamination note."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "--turns", "3", "-n", "2", "-c", "2", "--input-len", "40",
         "--output-len", "4", "--ignore-eos", "--think-time", "0.05", "--workers", "1", "-o", str(tmp_path),
         "--name", "mt", "--report", str(tmp_path / "rep")], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = json.loads((tmp_path / "mt.json").read_text())["runs"]
    s = run["summary"]
    assert run["mode"] == "multi-turn" and s["completed"] == 6 and s["total_output_tokens"] == 24
    assert [t["completed"] for t in s["per_turn"]] == [2, 2, 2]
    prompts = [t["prompt_tokens_mean"] for t in s["per_turn"]]
    assert prompts[0] < prompts[1] < prompts[2]  # each turn's prompt holds the history (the server's count)
    cache = run["prefix_cache"]
    assert cache["history_tokens"] > 0 and 0 < cache["history_hit_tokens"] <= cache["history_tokens"]
    assert "seen these prompts" not in res.stdout and "TTFT turn 2" in res.stdout
    assert {"roofline", "telemetry", "server_series"} <= set(run)
    # the report's per-turn table: one row per turn with its completed count and mean prompt
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md.split("## Multi-turn: TTFT per turn")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| llmrs")]
    assert [ln.split("|")[3].strip() for ln in rows] == ["0", "1", "2"]  # turn indices as in the JSON and the table
    assert [ln.split("|")[4].strip() for ln in rows] == ["2", "2", "2"]
    assert [ln.split("|")[5].strip() for ln in rows] == [f"{p:,.0f}" for p in prompts]


def test_without_n_a_probe_sizes_multi_turn_runs_in_conversations(server, tmp_path):
    """No -n: the probe sends conversations, measures the server's tokens/s over requests as sent (history
    included) and sizes the run in conversations of the probe's mean length."""
    url, _ = server
    wl = WorkloadConfig(input_len=6, output_len=2, multi_turn=True, turns=2, backend="chat")
    doc, text = _run(url, tmp_path, "sized", workload=wl, concurrency=2, auto_num_prompts=True, duration=0.5)
    (run,) = doc["runs"]
    assert run["sizing"] is not None and run["sizing"]["concurrency"] == 2
    n = run["multi_turn"]["conversations"]
    assert n == max(1, round(run["sizing"]["num_prompts"] / 2)) and run["num_prompts"] == 2 * n
    assert f"2.0 turns a conversation in the probe: sending {n:,} conversation" in text
