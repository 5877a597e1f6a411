"""`llmrs profile --timeline`'s pure parts: the trace split at its markers, the graphed kernels matched to the eager
step's spans, exposed time and gaps, per-role floors, JSON round trip and `--from`."""

import json

import pytest

from llmrs.profiling import timeline as tl
from llmrs.cli import main
from llmrs.errors import UserError


def ev(name, ts, dur, grid=(1, 1, 1), block=(128, 1, 1)):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": list(grid),
                                                                                  "block": list(block)}}


def mark(i, ts):
    return ev("llmrs_mark", ts, 1.0, grid=(i + 1, 1, 1), block=(1, 1, 1))


def sep(ts):
    return ev("llmrs_mark", ts, 1.0, grid=(1, 1, 1), block=(2, 1, 1))


SPANS = [("matvec", "qkv", (1, 4096, 2048, False, False)),   # 2 * 4096 * 2048 weights + x + out: 16.8 MB
         ("attention", "attention", (1, 16, 2, 128, 512, 512, 8)),
         ("matvec", "o", (1, 2048, 2048, True, False))]


def trace(step_starts):
    """An eager step (span 0: one kernel; span 1: two kernels; span 2: one; then a kernel the graph lacks) then
    graphed steps whose kernels overlap (PDL), each starting in launch order: qkv 0-10, attention 2-15, merge 14-17,
    o 15-20, then, after 5 idle, a kernel only the graph has 25-26."""
    evs = [mark(0, 0), ev("matvec_a", 2, 5), mark(1, 10), ev("attn", 12, 4), ev("merge", 17, 2), mark(2, 20),
           ev("matvec_b", 22, 6), ev("unrelated_sampler", 30, 1)]
    for t0 in step_starts:
        evs.append(sep(t0 - 5))
        evs += [ev("matvec_a", t0, 10), ev("attn", t0 + 2, 13), ev("merge", t0 + 14, 3), ev("matvec_b", t0 + 15, 5),
                ev("graph_only", t0 + 25, 1)]
    evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1})  # not a kernel: skipped
    return {"traceEvents": evs}


def test_split_and_match():
    kernels = tl.kernels_from_trace(trace([100, 200]))
    eager, steps = tl.split_trace(kernels)
    assert [(k.name, s) for k, s in eager] == [("matvec_a", 0), ("attn", 1), ("merge", 1), ("matvec_b", 2),
                                               ("unrelated_sampler", 2)]
    assert [[k.name for k in s] for s in steps] == [["matvec_a", "attn", "merge", "matvec_b", "graph_only"]] * 2
    assert tl.match_spans(eager, steps[0]) == [0, 1, 1, 2, None]


def test_exposed_and_gaps():
    step = [tl.Kernel("a", 0, 10), tl.Kernel("b", 2, 15), tl.Kernel("c", 12, 20), tl.Kernel("d", 25, 26)]
    rows = tl.step_rows(step)
    assert rows == [(10, 0, 10), (5, 0, 13), (5, 0, 8), (1, 5, 1)]
    assert sum(e + g for e, g, _ in rows) == 26 - 0  # exposed + gaps = the step's span


def test_analyze_roles_and_floors():
    kernels = tl.kernels_from_trace(trace([100, 200, 300]))
    eager, steps = tl.split_trace(kernels)
    t = tl.analyze(eager, steps, SPANS, bandwidth=1e12, wall_ms=0.05)
    assert t.steps == 3 and t.span_us == pytest.approx(26.0) and t.gap_us == pytest.approx(5.0)
    roles = {r.role: r for r in t.roles}
    assert roles["matvec qkv"].exposed_us == pytest.approx(10.0)
    assert roles["attention"].exposed_us == pytest.approx(5.0 + 2.0) and roles["attention"].calls == 2
    assert roles["matvec o"].exposed_us == pytest.approx(3.0)
    from llmrs.profiling.profile import kernel_cost

    assert roles["matvec qkv"].floor_us == pytest.approx(kernel_cost(*SPANS[0][::2])[0] / 1e12 * 1e6)
    assert roles["matvec o"].floor_us == pytest.approx(kernel_cost(*SPANS[2][::2])[0] / 1e12 * 1e6)
    assert roles["(graph only) graph_only"].calls == 1 and t.unmatched == 1
    assert sum(r.exposed_us for r in t.roles) + t.gap_us == pytest.approx(t.span_us)
    assert t.floor_us == pytest.approx(sum(r.floor_us for r in t.roles))


def test_one_layer_is_the_middle_one():
    rows = [tl.Row(i, f"k{i}", i, role, 1.0, 0.0, 2.0) for i, role in enumerate(
        ["embedding", "matvec qkv", "attention", "matvec down", "matvec qkv", "attention", "matvec down",
         "matvec qkv", "attention", "matvec_q down+norm", "matvec lm_head"])]
    t = tl.Timeline("decode B=1", 1, 1, 0.0, 11.0, 0.0, 1.0, rows=rows)
    assert [r.index for r in tl.one_layer(t)] == [7, 8, 9]  # the second of the two whole layers
    t.rows = rows[:4]
    assert tl.one_layer(t) == []


def test_odd_step_left_out():
    doc = trace([100, 200, 300])
    doc["traceEvents"].append(ev("late_extra", 327, 1))  # the last step launched one more: not the usual count
    eager, steps = tl.split_trace(tl.kernels_from_trace(doc))
    assert tl.analyze(eager, steps, SPANS, 1e12).steps == 2


def test_no_graphed_steps_is_a_user_error():
    eager, steps = tl.split_trace(tl.kernels_from_trace({"traceEvents": [mark(0, 0), ev("k", 1, 1)]}))
    with pytest.raises(UserError, match="no graphed step"):
        tl.analyze(eager, steps, SPANS, 1e12)


def run_cli(capsys, args):
    try:
        main(args)
    except SystemExit as e:
        out = capsys.readouterr()
        return e.code, out.out, out.err
    out = capsys.readouterr()
    return 0, out.out, out.err


def test_json_round_trip_and_from(tmp_path, capsys):
    eager, steps = tl.split_trace(tl.kernels_from_trace(trace([100, 200])))
    t = tl.analyze(eager, steps, SPANS, 1e12, wall_ms=0.05)
    meta = {"model": "synthetic:test", "gpu_name": "H200", "bandwidth_gbs": 1000.0, "context": 512,
            "ceilings": "datasheet", "note": "n"}
    path = tmp_path / "tl.json"
    tl.save_json(path, [t], meta)
    back, meta2 = tl.from_json(json.loads(path.read_text()))
    assert back == [t] and meta2["model"] == "synthetic:test" and meta2["kind"] == "timeline"
    rc, out, _ = run_cli(capsys, ["profile", "--from", str(path), "--out", str(tmp_path / "again.json")])
    assert rc == 0 and "matvec qkv" in out and "idle (gaps)" in out and "above floor" in out
    assert "one layer" not in out  # one layer only: no middle one between two downs
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(path.read_text())
    rc, out, _ = run_cli(capsys, ["profile", "--from", str(path), "--json"])
    assert rc == 0 and json.loads(out)["timelines"][0]["steps"] == 2
    rc, _, err = run_cli(capsys, ["profile", "--from", str(path), "--plot", str(tmp_path / "p.png")])
    assert rc == 2 and "timeline" in err and "Traceback" not in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "timeline", "timelines": [{"label": 1}]}))
    rc, _, err = run_cli(capsys, ["profile", "--from", str(bad)])
    assert rc == 2 and "not an llmrs timeline" in err and "Traceback" not in err


@pytest.mark.parametrize("extra,word", [(["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
                                        (["--plot", "p.png"], "--plot"), (["--steps", "0"], "--steps"),
                                        (["--no-graphs"], "--no-graphs"), (["--prefill-len", "64"], "--prefill-len"),
                                        (["--prefill-seqs", "4"], "--prefill-seqs")])
def test_timeline_refusals_are_one_line(tmp_path, capsys, monkeypatch, extra, word):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, ["profile", "--synthetic", "qwen2.5-0.5b", "--timeline", *extra])
    assert rc == 2 and err.startswith("error:") and word in err and "Traceback" not in err


@pytest.mark.gpu
def test_timeline_of_a_tiny_models_graphed_steps(tmp_path):
    """The real thing on a tiny model: every graphed projection matched to an eager span (a graph captured for a
    longer context may split its attention where the eager step does not: attn_merge may be graph-only), the exposed
    times and gaps adding up to the step's span, one qkv / attention / down per layer, and the JSON."""
    from tests.conftest import write_tiny_model
    from tests.cuda_helpers import require_gpu

    require_gpu()
    pytest.importorskip("torch")
    path = write_tiny_model(tmp_path / "qwen2", "qwen2")
    timelines, meta = tl.run_timeline(str(path), [1, 3], context=40, steps=4, warmup=2)
    assert [t.label for t in timelines] == ["decode B=1", "decode B=3"]
    layers = 3
    for t in timelines:
        graph_only = [r.name for r in t.rows if r.span is None]
        assert t.steps >= 3 and t.unmatched == len(graph_only) and set(graph_only) <= {"attn_merge"}, graph_only
        assert sum(r.exposed_us for r in t.roles) + t.gap_us == pytest.approx(t.span_us, rel=1e-6)
        assert 0 < t.floor_us < t.span_us and t.wall_ms > 0
        down = [r for r in t.roles if r.role.endswith(" down")]  # matvec at one token, the GEMM at three here
        assert len(down) == 1 and down[0].calls == layers and down[0].floor_us > 0
        assert sum(r.calls for r in t.roles if r.role.startswith(("attention", "attn_o"))) >= layers
        assert any(r.role.startswith(("matvec", "gemm")) and "qkv" in r.role and r.calls == layers for r in t.roles)
        assert all(r.duration_us > 0 for r in t.rows)
    tl.save_json(tmp_path / "t.json", timelines, meta)
    back, _ = tl.from_json(json.loads((tmp_path / "t.json").read_text()))
    assert back == timelines


def test_timeline_without_torch_is_one_clear_error(monkeypatch):
    """--timeline reads CUPTI through PyTorch's profiler: without torch, one UserError naming what to install."""
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(UserError, match="pip install torch"):
        tl._torch_profiler()
