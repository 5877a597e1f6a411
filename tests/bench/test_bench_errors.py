"""`llmrs bench` / `llmrs report` when things go wrong: every request failing, an unreachable or wrong server,
malformed /v1/models replies, bad dataset files, results files missing fields, outputs that cannot be written.

A user's mistake is one `error: ...` line on stderr and exit code 2, never a traceback; a run in which nothing was
measured shows its statistics as "-" (null in the JSON), never as 0.00. The servers are real HTTP servers on
127.0.0.1 (a stdlib stub whose replies each test chooses); the files are real files written by the tests.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from llmrs.cli import bench as bench_cli
from llmrs.bench.dataset import WorkloadConfig, build_workload
from llmrs.bench.metrics import summarize
from llmrs.bench.records import RequestResult
from llmrs.bench.report import REPORT_MD, load_rows, write_report
from llmrs.bench.server import free_port
from llmrs.bench.sysinfo import server_identity
from llmrs.cli import main
from llmrs.errors import UserError

MODELS = {"object": "list", "data": [{"id": "smollm2-135m", "object": "model", "owned_by": "llmrs"}]}


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


OK_STREAM = _sse({"choices": [{"text": "a", "finish_reason": None}]},
                 {"choices": [{"text": "b", "finish_reason": "length"}]},
                 {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}, b"[DONE]")
REPLIES = {  # mode -> (status, content type, body) of POST /v1/completions
    "ok": (200, "text/event-stream", OK_STREAM),
    "500": (500, "application/json", b'{"error": {"message": "boom"}}'),
    "400": (400, "application/json", b'{"error": {"message": "the prompt is longer than the context"}}'),
    "notjson": (200, "text/event-stream", b"data: this is not json\n\n"),
    "plainjson": (200, "application/json", b'{"choices": [{"text": "hi", "finish_reason": "stop"}]}'),
    "sse_error": (200, "text/event-stream", _sse({"error": {"message": "overloaded"}}, b"[DONE]")),
}


class Stub(ThreadingHTTPServer):
    """An OpenAI-shaped server whose /v1/models reply (`models`: JSON-able, or None for a 404) and completion
    reply (`mode`, a key of REPLIES) each test sets; anything else is a 404."""

    daemon_threads = True
    models: object = MODELS
    mode = "ok"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Stub

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models" and self.server.models is not None:
            self._send(200, "application/json", json.dumps(self.server.models).encode())
        else:
            self._send(404, "application/json", b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            self._send(*REPLIES[self.server.mode])
        else:
            self._send(404, "application/json", b'{"error": {"message": "not found"}}')


@pytest.fixture()
def stub():
    srv = Stub(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _llmrs(capsys, *args: str) -> tuple[int, str, str]:
    """Runs `llmrs ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _bench(capsys, url: str, out: Path, *more: str) -> tuple[int, str, str]:
    return _llmrs(capsys, "bench", "--url", url, "-n", "2", "-c", "2", "--workers", "1", "--prompt-format", "ids",
                  "--input-len", "4", "--output-len", "2", "--timeout", "20", "-o", str(out), *more)


def _one_error_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# 1. every request failing


@pytest.mark.parametrize(("mode", "endpoint", "reason"), [
    ("500", "", "HTTP 500: 2"),
    ("400", "", "HTTP 400: 2"),
    ("notjson", "", "bad event: 2"),
    ("plainjson", "", "no content received: 2"),
    ("sse_error", "", "stream error: 2"),
    ("ok", "/nope", "HTTP 404: 2"),
])
def test_a_run_in_which_every_request_failed_is_an_error_with_null_statistics(stub, tmp_path, capsys, mode, endpoint,
                                                                              reason):
    stub.mode = mode
    code, out, err = _bench(capsys, stub.url, tmp_path, "-m", "smollm2-135m", "--name", "x",
                            *(["--endpoint", endpoint] if endpoint else []))
    line = _one_error_line(code, err)
    assert line.startswith(f"error: all 2 requests failed ({reason}); each failure is in "), line
    assert "warning: every request of c2-rinf failed" in out
    assert "- / -" in out and "0.00 / 0.00" not in out  # the table shows nothing measured, not zeros
    doc = json.loads((tmp_path / "x.json").read_text())  # the results stay, for the failures to be read
    s = doc["runs"][0]["summary"]
    assert s["completed"] == 0 and s["failed"] == 2
    assert s["ttft_ms"] is None and s["tpot_ms"] is None and s["itl_ms"] is None and s["e2el_ms"] is None
    assert (tmp_path / doc["runs"][0]["csv"]).read_text().count("\n") == 3  # header + both failures
    # the report shows the run with "-" where nothing was measured
    write_report([str(tmp_path / "x.json")], tmp_path / "rep")
    row = next(ln for ln in (tmp_path / "rep" / REPORT_MD).read_text().splitlines() if ln.startswith("| llmrs |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:4] == ["0", f"2 ({reason})"]
    assert cells[7:14] == ["-"] * 7  # TTFT p50/p99, queued TTFT p50, TPOT p50/p99, ITL p50, E2E p50


def test_statistics_of_no_requests_are_none_not_zero():
    failed = [RequestResult(idx=i, input_len=4, start=1.0, end=1.5, error="HTTP 500: boom") for i in range(3)]
    s = summarize(failed, 1.0)
    assert (s.completed, s.failed, s.failures) == (0, 3, {"HTTP 500": 3})
    assert s.ttft_ms is None and s.tpot_ms is None and s.itl_ms is None and s.e2el_ms is None
    assert s.to_dict()["ttft_ms"] is None


# 2. unreachable server, wrong model


def test_an_unreachable_url_says_it_cannot_reach_it(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = _bench(capsys, url, tmp_path, "-m", "some-model")
    line = _one_error_line(code, err)
    assert line.startswith(f"error: cannot reach {url}: "), line
    assert "tokenize" not in line


def test_a_model_the_server_does_not_serve_is_named_with_what_it_serves(stub, tmp_path, capsys):
    code, _, err = _bench(capsys, stub.url, tmp_path, "-m", "wrongmodel")
    line = _one_error_line(code, err)
    assert line == f"error: model 'wrongmodel' is not served at {stub.url} (it serves: smollm2-135m)"


def test_a_server_without_v1_models_still_runs_and_names_results_bench_time(stub, tmp_path, capsys):
    """... and without --label/--name the results are bench-YYYYmmdd-HHMMSS.json, as --help says."""
    stub.models = None
    code, _, err = _bench(capsys, stub.url, tmp_path, "-m", "anything")
    assert code == 0, err
    [path] = tmp_path.glob("*.json")
    assert path.name.startswith("bench-") and len(path.stem) == len("bench-20250101-120000")
    assert json.loads(path.read_text())["runs"][0]["summary"]["completed"] == 2
    app = typer.Typer()
    bench_cli.register(app)
    help_text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "300"}).output
    flat = " ".join(help_text.replace("│", " ").split())
    assert "Results file stem (default: LABEL-YYYYmmdd-HHMMSS with --label, else bench-YYYYmmdd-HHMMSS)" in flat
    assert "(default: owned_by from /v1/models)" in flat  # shown: not taken for rich markup as "[default: ...]" was


# 3. malformed /v1/models replies


@pytest.mark.parametrize("reply", [{"data": "x"}, {"data": [{"noid": 1}]}, [{"id": "m"}], "text", {"data": [5, None]}])
def test_a_malformed_model_list_is_no_model_list(stub, tmp_path, capsys, reply):
    stub.models = reply
    ident = server_identity(stub.url)
    assert ident["models"] == []
    code, _, err = _bench(capsys, stub.url, tmp_path / "a")  # no --model: nothing to take one from
    assert _one_error_line(code, err).startswith(f"error: no --model given and {stub.url} names none (/v1/models: ")
    code, _, err = _bench(capsys, stub.url, tmp_path / "b", "-m", "m")  # with --model: runs
    assert code == 0, err


def test_model_entries_keep_only_fields_of_openai_types(stub):
    stub.models = {"data": [{"id": "a", "owned_by": 7, "max_model_len": "x", "root": "org/a"}, {"id": 3}]}
    assert server_identity(stub.url)["models"] == [{"id": "a", "root": "org/a"}]


# 4. bad dataset files


@pytest.mark.parametrize(("name", "text", "message"), [
    ("empty.jsonl", "", "has no prompts"),
    ("blank.jsonl", "\n   \n\n", "has no prompts"),
    ("int.jsonl", '{"prompt": 5}\n', "line 1: 'prompt' must be text or a list of token ids"),
    ("strs.jsonl", '{"prompt": ["a", "b"]}\n', "line 1: 'prompt' must be text or a list of token ids"),
    ("emptyprompt.jsonl", '{"prompt": "ok"}\n{"prompt": ""}\n', "line 2: 'prompt' is empty"),
    ("zero.jsonl", '{"prompt": "hi", "output_len": 0}\n', "line 1: 'output_len' must be a whole number >= 1 (got 0)"),
    ("frac.jsonl", '{"prompt": "hi", "output_len": 2.5}\n', "'output_len' must be a whole number >= 1 (got 2.5)"),
    ("second.jsonl", '{"prompt": "ok"}\n\n{"prompt": oops}\n', "line 3 is not valid JSON: Expecting value"),
    ("turns.json", '[{"conversations": ["hi"]}]', "item 0: 'conversations' must be a list of"),
    ("value.json", '[{"conversations": [{"from": "human", "value": 5}]}]', "item 0: a turn's 'value' must be text"),
    ("broken.json", '[{"conversations": ', "is not valid JSON"),
])
def test_a_bad_dataset_file_is_a_user_error_naming_the_line(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(UserError, match="--dataset: ") as e:
        asyncio.run(build_workload(WorkloadConfig(num_prompts=3, dataset=str(p)), None))
    assert str(p) in str(e.value) and message in str(e.value), str(e.value)


def test_a_directory_as_dataset_is_called_a_directory(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        asyncio.run(build_workload(WorkloadConfig(dataset=str(tmp_path)), None))


def test_dataset_output_lengths_are_honoured_and_ids_kept(tmp_path):
    p = tmp_path / "ok.jsonl"
    p.write_text('{"prompt": [5, 6, 7], "output_len": 3}\n"plain text"\n{"prompt": "x", "max_tokens": 9.0}\n')
    specs = asyncio.run(build_workload(WorkloadConfig(num_prompts=3, dataset=str(p)), None))
    assert sorted((s.output_len, str(s.prompt)) for s in specs) == [(3, "[5, 6, 7]"), (9, "x"), (128, "plain text")]


# 5. results files missing fields; the same file named twice


def _results(path: Path, summary: object, label: str = "eng") -> None:
    run = {"tag": "c1-rinf", "concurrency": 1, "request_rate": "inf", "summary": summary}
    path.write_text(json.dumps({"schema": "llmrs.bench/1", "label": label, "params": {}, "runs": [run]}))


def test_report_renders_missing_statistics_as_dash(tmp_path, capsys):
    _results(tmp_path / "old.json", {"completed": 5, "failed": 0, "output_throughput": 12.5, "ttft_ms": None,
                                     "tpot_ms": {"median": 4.0}})
    code, _, err = _llmrs(capsys, "report", str(tmp_path / "old.json"), "-o", str(tmp_path / "rep"))
    assert code == 0, err
    md = (tmp_path / "rep" / REPORT_MD).read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| eng |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == ["5", "0", "-", "12.5"]
    # TTFT p50, p99 and the queued TTFT missing; TPOT p50 there; its p99 has no max: "-"
    assert cells[7:11] == ["-", "-", "-", "4.00"]
    assert "| completions 0->128, c=1, rate=inf | 12.5 tok/s | - ms | 4.00 ms | - ms |" in md


def test_report_of_a_run_without_summary_names_file_and_field(tmp_path, capsys):
    _results(tmp_path / "bad.json", None)
    code, _, err = _llmrs(capsys, "report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "rep"))
    line = _one_error_line(code, err)
    assert line == f"error: {tmp_path / 'bad.json'}: runs[0] has no 'summary' (an object of the run's statistics)"


def test_report_counts_a_file_named_twice_once(tmp_path):
    _results(tmp_path / "a.json", {"completed": 1, "failed": 0})
    rows = load_rows([str(tmp_path), str(tmp_path / "a.json"), str(tmp_path / "." / "a.json")])
    assert len(rows) == 1


# 6. outputs that cannot be written


def test_bench_results_path_that_is_a_directory_is_a_user_error(stub, tmp_path, capsys):
    (tmp_path / "x.json").mkdir()
    code, _, err = _bench(capsys, stub.url, tmp_path, "-m", "smollm2-135m", "--name", "x")
    assert _one_error_line(code, err) == f"error: cannot write results {tmp_path / 'x.json'}: Is a directory"


FULL_DISK = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             "resource.setrlimit(resource.RLIMIT_FSIZE, ({0}, {0})); from llmrs.cli import main; main(sys.argv[1:])")


def _llmrs_on_a_full_disk(limit: int, *args: str) -> subprocess.CompletedProcess:
    """`llmrs ARGS` in a process that may write files of at most `limit` bytes (writes past it fail as they do
    on a full disk: an OSError from write())."""
    return subprocess.run([sys.executable, "-c", FULL_DISK.format(limit), *args], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])


def test_report_that_cannot_write_its_files_is_a_user_error(tmp_path):
    _results(tmp_path / "a.json", {"completed": 1, "failed": 0, "output_throughput": 3.0})
    p = _llmrs_on_a_full_disk(2000, "report", str(tmp_path / "a.json"), "-o", str(tmp_path / "rep"))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"error: cannot write {tmp_path / 'rep'}/") and p.stderr.count("\n") == 1, p.stderr
    assert "File too large" in p.stderr


def test_bench_that_cannot_write_its_results_is_a_user_error(stub, tmp_path):
    p = _llmrs_on_a_full_disk(300, "bench", "--url", stub.url, "-m", "smollm2-135m", "-n", "2", "--workers", "1",
                              "--prompt-format", "ids", "--input-len", "4", "-o", str(tmp_path), "--name", "x")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr == f"error: cannot write results {tmp_path / 'x.json'}: File too large\n"
    assert not (tmp_path / "x.json.tmp").exists()  # no half-written file left behind


# 7. options out of range


@pytest.mark.parametrize(("args", "message"), [
    (["--warmup", "-3"], "--warmup must be >= 0"),
    (["--timeout", "0"], "--timeout must be a positive number"),
    (["--timeout", "nan"], "--timeout must be a positive number"),
    (["--server-timeout", "-1"], "--server-timeout must be a positive number"),
    (["--slo", "ttft=-5"], "milliseconds must be a positive number"),
    (["--slo", "ttft=abc"], "'abc' is not a number of milliseconds"),
    (["--sweep", "request_rate=nan"], "values must be > 0"),
    (["--sweep", "concurrency=1,nan"], "values must be > 0"),
])
def test_out_of_range_options_are_rejected(tmp_path, capsys, args, message):
    url = f"http://127.0.0.1:{free_port()}"  # never reached: the options are checked first
    code, _, err = _bench(capsys, url, tmp_path, *args)
    line = _one_error_line(code, err)
    assert message in line and "cannot reach" not in line, line
