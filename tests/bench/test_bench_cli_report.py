"""`llmrs bench` / `llmrs report` end to end through the typer commands: --server-cmd start/health/stop,
results saved, report markdown + PNGs with deterministic names, user mistakes as UserError."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from llmrs.cli import bench as cli
from llmrs.bench.plots import SWEEP_PLOTS
from llmrs.bench.report import REPORT_MD, write_report
from llmrs.bench.server import ManagedServer
from llmrs.errors import UserError
from tests.bench_fixtures.serving import fake_server_cmd


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    a = typer.Typer()
    cli.register(a)
    return a


def _invoke(app, args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=True)


def test_bench_with_server_cmd_saves_results_and_writes_report(app, tmp_path):
    cmd = shlex.join(fake_server_cmd(gap_ms=1))
    res = _invoke(app, [
        "bench", "--server-cmd", cmd, "-n", "12", "--sweep", "concurrency=2,4", "--input-len", "16", "--output-len", "6",
        "--workers", "2", "--label", "fake", "--slo", "ttft=500", "-o", str(tmp_path / "res"), "--name", "cli",
        "--report", str(tmp_path / "rep"),
    ])
    assert res.exit_code == 0, res.output + repr(res.exception)
    doc = json.loads((tmp_path / "res" / "cli.json").read_text())
    assert doc["server"]["managed"] and "fake_server.py" in doc["server"]["command"]
    assert [r["tag"] for r in doc["runs"]] == ["c2-rinf", "c4-rinf"]
    assert all(r["summary"]["completed"] == 12 for r in doc["runs"])
    assert doc["command"].startswith("llmrs ")
    assert (tmp_path / "res" / "cli.server.log").is_file()
    md = (tmp_path / "rep" / REPORT_MD).read_text()
    assert "## Side by side" in md and "fake" in md and "c=4" in md
    assert all((tmp_path / "rep" / p).stat().st_size > 1000 for p in SWEEP_PLOTS)
    # the started server was stopped: its port no longer answers
    import httpx

    with pytest.raises(httpx.HTTPError):
        httpx.get(doc["server"]["url"] + "/health", trust_env=False, timeout=2)


def _fake_results(path: Path, label: str, scale: float, **params) -> None:
    def dist(v):
        return {"mean": v, "median": v, "std": 0.0, "min": v, "max": v, "percentiles": {"p50": v, "p90": v * 1.1, "p99": v * 1.5}}

    runs = []
    for c in (1, 16, 64):
        s = {
            "completed": 100, "failed": 0, "duration_s": 10.0, "total_input_tokens": 25600, "total_output_tokens": 12800,
            "request_throughput": 10.0 * scale, "output_throughput": 30.0 * c**0.8 * scale, "total_token_throughput": 100.0 * c * scale,
            "peak_concurrency": c, "ttft_ms": dist(20.0 * c**0.5 / scale), "tpot_ms": dist(25.0 / scale), "itl_ms": dist(25.0 / scale),
            "e2el_ms": dist(3000.0 / scale), "failures": {}, "goodput": None, "slo": {}, "usage_missing": 0, "usage_mismatch": 0,
            "max_output_tokens_per_s": 0.0,
        }
        runs.append({"tag": f"c{c}-rinf", "concurrency": c, "request_rate": "inf", "summary": s, "client_cpu": {"busy_per_worker": [0.2]}, "csv": "x.csv"})
    doc = {"schema": "llmrs.bench/1", "label": label, "params": {"backend": "completions", "input_len": 256, "output_len": 128, **params}, "runs": runs,
           "command": f"llmrs bench --url http://h:8000 --label {label}", "llmrs_version": "0.1.0",
           "server": {"server_header": "uvicorn", "models": [{"id": f"{label}-model"}]},
           "gpus": [{"name": "NVIDIA H200", "memory_gib": 140.4, "driver": "580"}],
           "client": {"cpu_count": 16, "python": "3.12.3"}}
    path.write_text(json.dumps(doc))


def test_report_is_side_by_side_with_ratios_and_deterministic(tmp_path):
    _fake_results(tmp_path / "a.json", "llmrs", 1.0)
    _fake_results(tmp_path / "b.json", "vLLM", 2.0)
    out1, out2 = tmp_path / "r1", tmp_path / "r2"
    write_report([str(tmp_path / "a.json"), str(tmp_path / "b.json")], out1)
    write_report([str(tmp_path)], out2)  # a directory of results: same report
    assert sorted(p.name for p in out1.iterdir()) == sorted([REPORT_MD, *SWEEP_PLOTS])
    md = (out1 / REPORT_MD).read_text()
    assert md == (out2 / REPORT_MD).read_text()
    assert all((out1 / p).read_bytes() == (out2 / p).read_bytes() for p in SWEEP_PLOTS)  # diff cleanly in git
    assert "(llmrs / vLLM)" in md and "2.00x" in md  # vLLM twice the throughput, half the latency
    row = next(ln for ln in md.splitlines() if "c=16" in ln and ln.startswith("| completions"))
    assert "(2.00x)" in row
    # where each ran: model, GPU, client, and every file's command
    setup = md[md.index("## Where each ran"):]
    assert "**llmrs**: model llmrs-model; server `uvicorn`; GPU NVIDIA H200 (140.4 GiB, driver 580)" in setup
    assert "- `b.json`: `llmrs bench --url http://h:8000 --label vLLM`" in setup
    write_report([str(tmp_path)], tmp_path / "r3", baseline="vLLM")
    assert "(0.50x)" in (tmp_path / "r3" / REPORT_MD).read_text()
    # a reports folder also holds other JSON (profiles, decode benches): the directory form reads only results
    (tmp_path / "profile.json").write_text('{"steps": []}')
    (tmp_path / "broken.json").write_text("{")
    write_report([str(tmp_path)], tmp_path / "r4")
    assert (tmp_path / "r4" / REPORT_MD).read_text() == md


def test_report_flags_runs_whose_server_ran_shapes_eagerly(tmp_path):
    """A run saved with server_graph_capture_failures > 0 (an llmrs server whose graph captures failed) gets a caveat
    in the report naming the engine, file and setting; runs with 0 or without the field (other servers, older
    files) get none, and a report without such runs has no caveats section."""
    _fake_results(tmp_path / "a.json", "llmrs", 1.0)
    _fake_results(tmp_path / "b.json", "vLLM", 2.0)
    write_report([str(tmp_path)], tmp_path / "r0")
    assert "## Caveats" not in (tmp_path / "r0" / REPORT_MD).read_text()
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["runs"][1]["server_graph_capture_failures"] = 27
    doc["runs"][2]["server_graph_capture_failures"] = 0
    (tmp_path / "a.json").write_text(json.dumps(doc))
    write_report([str(tmp_path)], tmp_path / "r1")
    md = (tmp_path / "r1" / REPORT_MD).read_text()
    caveats = md[md.index("## Caveats"):md.index("## Where each ran")].strip().splitlines()
    assert caveats[2:] == ["- **llmrs** `a.json` completions 256->128, c=16, rate=inf: the server ran 27 step "
                           "shape(s) eagerly (their CUDA graph capture failed; the server's log says why): not its "
                           "graphed speed."]
    doc["runs"][2].update(interrupted=True)
    doc["runs"][2]["summary"].update(cut_off=3, not_sent=40)
    (tmp_path / "a.json").write_text(json.dumps(doc))
    write_report([str(tmp_path)], tmp_path / "r2")
    md = (tmp_path / "r2" / REPORT_MD).read_text()
    assert ("- **llmrs** `a.json` completions 256->128, c=64, rate=inf: interrupted; only the requests that finished "
            "are measured (3 cut off in flight, 40 never sent).") in md


def test_report_keeps_sampled_runs_apart_from_greedy_ones(tmp_path):
    """Runs whose requests sampled (--temperature / --top-p / --top-k / --min-p) are another workload: their own
    rows, lines and side-by-side settings, named by what they asked for; greedy runs (and results saved before these
    fields existed) keep their settings as they were."""
    from llmrs.bench.report import load_rows

    _fake_results(tmp_path / "a.json", "llmrs", 1.0, temperature=0.0)
    _fake_results(tmp_path / "b.json", "llmrs", 0.9, temperature=0.8, top_p=0.9, top_k=50, min_p=None)
    _fake_results(tmp_path / "c.json", "vLLM", 0.8, temperature=0.8, top_p=0.9, top_k=50)
    rows = load_rows([str(tmp_path)])
    assert {r.sampling for r in rows} == {"", "t=0.8 top_p=0.9 top_k=50"}
    assert {r.setting for r in rows if r.label == "llmrs"} == {
        "completions 256->128, c=1, rate=inf", "completions 256->128, c=16, rate=inf",
        "completions 256->128, c=64, rate=inf", "completions 256->128 t=0.8 top_p=0.9 top_k=50, c=1, rate=inf",
        "completions 256->128 t=0.8 top_p=0.9 top_k=50, c=16, rate=inf",
        "completions 256->128 t=0.8 top_p=0.9 top_k=50, c=64, rate=inf"}
    write_report([str(tmp_path)], tmp_path / "r")
    md = (tmp_path / "r" / REPORT_MD).read_text()
    side = md[: md.index("## Where each ran")]
    greedy = next(ln for ln in side.splitlines() if ln.startswith("| completions 256->128, c=16,"))
    sampled = next(ln for ln in side.splitlines()
                   if ln.startswith("| completions 256->128 t=0.8 top_p=0.9 top_k=50, c=16,"))
    assert "275.7 / - tok/s" in greedy  # greedy: llmrs alone (vLLM ran only sampled)
    assert "248.1 / 220.6 tok/s (0.89x)" in sampled  # sampled: llmrs's scale 0.9 against vLLM's 0.8


def test_user_mistakes_raise_user_error(app, tmp_path):
    for args in (
        ["bench", "--url", "localhost:8000"],
        ["bench", "--url", "http://127.0.0.1:1", "--slo", "speed=3"],
        ["bench", "--url", "http://127.0.0.1:1", "--sweep", "batch=1,2"],
        ["bench", "--url", "http://127.0.0.1:1", "--request-rate", "0"],
        ["report", str(tmp_path / "missing.json")],
        ["bench", "--url", "http://127.0.0.1:1", "--tensor-parallel-size", "2"],  # only for the server bench starts
        ["bench", "--server-cmd", "x --port {port}", "--serve-args", "--max-num-seqs 8"],
        ["bench", "--tensor-parallel-size", "0"],
        ["bench", "--url", "http://127.0.0.1:1", "--top-p", "1.5"],
        ["bench", "--url", "http://127.0.0.1:1", "--top-p", "0"],
        ["bench", "--url", "http://127.0.0.1:1", "--top-k", "-2"],
        ["bench", "--url", "http://127.0.0.1:1", "--min-p", "2"],
        ["bench", "--url", "http://127.0.0.1:1", "--temperature", "-1"],
    ):
        res = _invoke(app, args)
        assert isinstance(res.exception, UserError), (args, res.output, res.exception)
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert isinstance(_invoke(app, ["report", str(bad)]).exception, UserError)
    with pytest.raises(UserError, match="baseline"):
        _fake_results(tmp_path / "a.json", "x", 1.0)
        write_report([str(tmp_path / "a.json")], tmp_path / "r", baseline="nope")


def test_embedded_server_command_carries_tensor_parallel_and_serve_args(app, tmp_path, monkeypatch):
    from llmrs.bench import bench as bench_mod

    seen = {}

    def fake_run(opts):
        seen["argv"] = bench_mod.llmrs_serve_argv(opts.model, opts.serve_args)
        raise UserError("stop here")

    monkeypatch.setattr(bench_mod, "run_bench", fake_run)
    res = _invoke(app, ["bench", "-m", "synthetic:qwen2.5-72b", "--tensor-parallel-size", "2",
                        "--serve-args", "--max-num-seqs 256 --gpu-memory-utilization 0.85"])
    assert isinstance(res.exception, UserError)
    argv = seen["argv"]
    i = argv.index("serve")
    assert argv[i + 1:i + 8] == ["synthetic:qwen2.5-72b", "--max-num-seqs", "256", "--gpu-memory-utilization", "0.85",
                                 "--tensor-parallel-size", "2"]
    assert argv[-2:] == ["--port", "{port}"]


def test_server_cmd_that_dies_is_a_user_error_with_its_log(tmp_path):
    srv = ManagedServer.from_command("python -c 'import sys; print(\"boom\"); sys.exit(3)'", tmp_path / "s.log", startup_timeout=20)
    with pytest.raises(UserError, match="exited with code 3") as e:
        srv.start()
    assert "boom" in str(e.value)


def test_help_lists_every_option_with_defaults(app):
    res = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    for opt in ("--url", "--server-cmd", "--concurrency", "--request-rate", "--burstiness", "--range-ratio", "--dataset",
                "--prefix-len", "--ignore-eos", "--warmup", "--seed", "--timeout", "--api-key", "--label", "--workers",
                "--sweep", "--slo", "--tokenizer", "--prompt-format", "--temperature", "--top-p", "--top-k", "--min-p"):
        assert opt in res.output, opt
    assert "default: (16; a trace replay: no cap)" in " ".join(res.output.replace("[", "").replace("]", "").split())


def test_a_given_n_below_the_cap_is_kept_and_said(app, tmp_path):
    """A given -n below the cap sends -n requests and says that the cap cannot be reached (without -n, the run is
    sized by a probe: tests/bench/test_bench_sizing.py)."""
    from tests.bench_fixtures.serving import running

    common = ["--input-len", "8", "--output-len", "2", "--prompt-format", "ids", "--workers", "2", "-o", str(tmp_path)]
    with running() as (url, _):
        few = _invoke(app, ["bench", "--url", url, "-c", "16", "-n", "8", "--name", "few", *common])
        assert few.exit_code == 0, few.output + repr(few.exception)
    (run,) = json.loads((tmp_path / "few.json").read_text())["runs"]
    assert run["num_prompts"] == 8 and run["summary"]["completed"] == 8 and run["sizing"] is None
    assert "-n 8 is less than --concurrency 16: at most 8 requests are ever in flight" in " ".join(few.output.split())


def test_plots_start_at_zero_use_seconds_for_long_latencies_and_bars_for_single_runs(tmp_path):
    """The report's figures, read from their matplotlib axes: every value axis starts at 0; a latency plot whose
    largest value is 10 s or more is in seconds; one run per engine gets bars (throughput.png, latency.png: no
    one-point lines), several runs get lines against concurrency."""
    import matplotlib.pyplot as plt

    from llmrs.bench.plots import SINGLE_PLOTS, figures
    from llmrs.bench.report import load_rows

    _fake_results(tmp_path / "a.json", "llmrs", 1.0)
    _fake_results(tmp_path / "b.json", "vLLM", 0.04)  # its E2E 75 s: seconds where it is plotted
    rows = load_rows([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    sweep = figures(rows, ["llmrs", "vLLM"])
    assert list(sweep) == list(SWEEP_PLOTS)
    for name, fig in sweep.items():
        (ax,) = fig.axes
        assert ax.get_ylim()[0] == 0, name
        assert len(ax.get_lines()) >= 2 and all(len(ln.get_xdata()) == 3 for ln in ax.get_lines()), name
    assert sweep["latency_vs_throughput.png"].axes[0].get_xlim()[0] == 0
    assert sweep["latency_vs_throughput.png"].axes[0].get_ylabel() == "median E2E latency (s)"
    assert sweep["ttft_percentiles.png"].axes[0].get_ylabel() == "TTFT (ms)"  # at most 6 s (vLLM p99 at c=64)
    assert sweep["tpot_percentiles.png"].axes[0].get_ylabel() == "TPOT (ms)"  # at most 938 ms
    for fig in sweep.values():
        plt.close(fig)

    for p in ("a", "b"):  # one run each: c=16
        doc = json.loads((tmp_path / f"{p}.json").read_text())
        doc["runs"] = doc["runs"][1:2]
        (tmp_path / f"{p}1.json").write_text(json.dumps(doc))
    single = figures(load_rows([str(tmp_path / "a1.json"), str(tmp_path / "b1.json")]), ["llmrs", "vLLM"])
    assert list(single) == list(SINGLE_PLOTS)
    (tput,) = single["throughput.png"].axes
    assert tput.get_xlim()[0] == 0 and len(tput.patches) == 2 and not tput.get_lines()
    assert sorted(t.get_text() for t in tput.get_yticklabels()) == ["llmrs\nc=16", "vLLM\nc=16"]
    lat = single["latency.png"].axes
    assert [ax.get_title() for ax in lat] == ["TTFT", "TPOT", "E2E latency"]
    for ax in lat:
        assert ax.get_ylim()[0] == 0 and not ax.get_lines()
        assert len(ax.patches) == 2 * 4  # two runs x (mean, p50, p90, p99)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["mean", "p50", "p90", "p99"]
    assert [ax.get_ylabel() for ax in lat] == ["TTFT (ms)", "TPOT (ms)", "E2E latency (s)"]
    for fig in single.values():
        plt.close(fig)
