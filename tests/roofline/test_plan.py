"""`llmrs plan`: capacity figures against hand-worked ones (Qwen2.5-7B bf16 on an H200, as the roofline tests), the
SLO scan, --rate / --target-rate arithmetic, calibration on a hand-written bench results file, and the real CLI."""

import json
import math

import pytest

from llmrs.errors import UserError
from llmrs.roofline.analysis import decode_point
from llmrs.roofline.gpus import get_gpu
from llmrs.roofline.model_source import build_cost, resolve_model
from llmrs.roofline.plan import PlanModel, calibrate, make_plan, parse_slo
from llmrs.roofline.tp import analyze_tp
from tests.roofline.test_roofline_cli import llmrs

# Qwen2.5-7B by hand: 28 layers, hidden 3584, 28 query heads and 4 KV heads of 128, MLP 18944, vocab 152064 (untied)
L, H, Q, KV, INTER, VOCAB = 28, 3584, 3584, 512, 18944, 152064
MATMUL = L * (H * (Q + 2 * KV) + Q * H) + L * 3 * H * INTER  # 6,525,288,448 projection weights
KVB = 2 * L * 4 * 128 * 2  # 57,344 bytes of K and V per token
EMB_ROW = H * 2  # one bf16 embedding row, gathered per token
CHECKPOINT = 15_231_233_024  # bytes; the embedding (VOCAB x H bf16) is gathered, the rest streamed each step
STREAMED = CHECKPOINT - VOCAB * H * 2
BW, PEAK = 4800e9, 989.5e12  # H200 datasheet: bytes/s, dense bf16 FLOP/s
I, O = 512, 256


def seq_flops(ctx):  # one decode token: projections, attention over ctx, one logits row
    return 2 * MATMUL + 4 * L * Q * ctx + 2 * VOCAB * H


PROMPT_FLOPS = I * 2 * MATMUL + 4 * L * Q * I * (I + 1) / 2 + 2 * VOCAB * H  # causal attention, last logits row
PROMPT_BYTES = 2 * I * KVB + I * EMB_ROW  # KV written and read once, embedding rows (weights counted per step)
SEQ_BYTES = (I + O / 2) * KVB + KVB + EMB_ROW  # KV re-read at the mean context, one written, one row gathered


def hand_step(decode, prompts):
    mem = (STREAMED + decode * SEQ_BYTES + prompts * PROMPT_BYTES) / BW
    comp = (decode * seq_flops(I + O / 2) + prompts * PROMPT_FLOPS) / PEAK
    return max(mem, comp)


def model(tp=1, **kw):
    gpu = get_gpu("h200", with_measured=False)
    return PlanModel(gpu, build_cost(resolve_model("qwen2.5-7b")), tp=tp, **kw)


def test_memory_kv_per_concurrency_and_the_largest_that_fits():
    p = make_plan(model(), "qwen2.5-7b", I, O, concurrency=64)
    m = p.memory
    assert m.weight_bytes == CHECKPOINT
    assert m.kv_bytes_per_request == 768 * KVB == 44_040_192  # 44.0 MB per request of 512 + 256 tokens
    assert m.budget_bytes == pytest.approx(0.9 * 141e9)
    # (126.9 GB - 15.23 GB of weights) / 44.04 MB = 2535.6 -> 2535 requests
    assert m.max_concurrency == 2535 == math.floor((0.9 * 141e9 - CHECKPOINT) / (768 * KVB))
    pt = p.points[0]
    assert pt.kv_bytes / 1e9 == pytest.approx(2.8186, abs=1e-4) and pt.fits
    assert pt.memory_bytes == pytest.approx(CHECKPOINT + 64 * 768 * KVB)
    # TP 2 halves the weights and each request's KV per GPU
    m2 = make_plan(model(tp=2), "qwen2.5-7b", I, O).memory
    assert m2.weight_bytes == CHECKPOINT / 2 and m2.kv_bytes_per_request == 768 * KVB / 2
    assert m2.max_concurrency == math.floor((0.9 * 141e9 - CHECKPOINT / 2) / (768 * KVB / 2)) == 5417
    # a lower --gpu-memory-utilization leaves room for fewer requests
    assert make_plan(model(), "qwen2.5-7b", I, O, utilization=0.5).memory.max_concurrency == math.floor(
        (0.5 * 141e9 - CHECKPOINT) / (768 * KVB)) == 1254


def test_floor_tpot_at_one_request_is_the_decode_floor_2_95_ms():
    st = model().steps(I, O)
    # one request: 255/256 of a decode step and 1/256 of a prompt per step; memory-bound, the weights dominate
    assert st.tpot(1) == pytest.approx(hand_step(255 / 256, 1 / 256), rel=1e-12)
    assert st.tpot(1) * 1e3 == pytest.approx(2.954, abs=1e-3)
    # the roofline tests' batch-1 floor on the A5000 (18.41 ms) scaled to the H200's bandwidth: 14.14 GB / 4.8 TB/s
    assert STREAMED / BW * 1e3 == pytest.approx(18.41 * 768 / 4800, abs=0.01)


def test_floor_at_256_requests_is_compute_bound_with_one_prompt_joining_each_step():
    p = make_plan(model(), "qwen2.5-7b", I, O, concurrency=256)
    f = p.points[0].floor
    # 255 decoding sequences and one 512-token prompt per step: 10.41 TFLOP / 989.5 TFLOP/s = 10.52 ms
    tpot = (255 * seq_flops(640) + PROMPT_FLOPS) / PEAK
    assert tpot == hand_step(255, 1) and tpot * 1e3 == pytest.approx(10.517, abs=1e-3)
    assert f.tpot_s == pytest.approx(tpot, rel=1e-12)
    ttft = tpot / 2 + hand_step(255 * 255 / 256, 1 + 255 / 256)  # half the running step, then the prompt's step
    assert f.ttft_s == pytest.approx(ttft, rel=1e-12)
    assert f.e2e_s == pytest.approx(ttft + 255 * tpot)
    assert f.request_rate == pytest.approx(256 / f.e2e_s)  # Little's law
    assert f.output_tok_s == pytest.approx(256 / f.e2e_s * 256)


def test_ttft_of_a_lone_request_is_its_prefill_floor_incl_chunked_prompts():
    pm = model()
    # 512 tokens: 6.74 TFLOP of prefill over 989.5 TFLOP/s = 6.81 ms, no running step to wait for
    assert pm.steps(I, O).ttft(1) == pytest.approx(PROMPT_FLOPS / PEAK, rel=1e-12)
    assert PROMPT_FLOPS / PEAK * 1e3 == pytest.approx(6.807, abs=1e-3)
    # a 4096-token prompt takes two 2048-token steps, each streaming the weights: the roofline's prefill floor
    pre = pm.cost.prefill(1, 4096, 2048)
    assert pm.steps(4096, O).chunks == 2
    assert pm.steps(4096, O).ttft(1) == pytest.approx(max(pre.bytes / BW, pre.flops / PEAK), rel=1e-12)


def test_decode_step_agrees_with_the_roofline_and_tp_models():
    pm = model()
    st = pm.steps(I, O)  # context I + O/2 = 640
    for b in (1, 64, 256):
        assert st.mixed(b, 0) == pytest.approx(decode_point(pm.cost, pm.roofs, b, 640, 141e9).step_s, rel=1e-12)
    pm2 = model(tp=2)
    t = analyze_tp(pm2.gpu, pm2.cost, pm2.roofs, 2, [1, 64, 256], 640)
    for b, pt in zip((1, 64, 256), t.points):
        assert pm2.steps(I, O).mixed(b, 0) == pytest.approx(pt.step_s, rel=1e-12)
    # a prompt's 512 tokens pay the same all-reduce per token as decode: 2 x 28 x 3584 x 2 B x 2(N-1)/N / 450 GB/s
    assert pm2.comm_per_token == pytest.approx(2 * L * H * 2 * 1.0 / 450e9)
    assert pm2.steps(I, O).mixed(0, 1) == pytest.approx(
        max((STREAMED + PROMPT_BYTES) / 2 / BW, PROMPT_FLOPS / 2 / PEAK) + 512 * pm2.comm_per_token)


def test_slo_scan_finds_the_largest_concurrency_that_meets_it():
    p = make_plan(model(), "qwen2.5-7b", I, O, slo=parse_slo("ttft=200,tpot=50"))
    s = p.slo
    st = model().steps(I, O)
    c = s.max_concurrency
    assert st.tpot(c) <= 0.050 < st.tpot(c + 1) and st.ttft(c) <= 0.200  # TPOT binds first
    assert s.basis == "floor" and s.max_request_rate == pytest.approx(
        max(cc / (st.ttft(cc) + 255 * st.tpot(cc)) for cc in range(1, c + 1)))
    assert c in [pt.concurrency for pt in p.points]  # the table shows it
    assert all(pt.meets_slo == (pt.concurrency <= c) for pt in p.points)


@pytest.mark.parametrize("key", ["ttft", "tpot", "e2el"])
def test_a_looser_slo_never_gives_a_smaller_concurrency(key):
    pm = model()
    last = 0
    for ms in (5, 10, 20, 40, 80, 160, 320, 1000, 5000, 20000, 100000):
        c = make_plan(pm, "qwen2.5-7b", I, O, slo={key: ms}).slo.max_concurrency or 0
        assert c >= last, (key, ms)
        last = c
    assert last == 2535  # loose enough: every concurrency that fits


def test_an_slo_no_concurrency_meets_says_so_and_needs_no_gpus():
    p = make_plan(model(), "qwen2.5-7b", I, O, slo={"ttft": 1}, rate=1.0, target_rate=10)
    assert p.slo.max_concurrency is None and p.slo.max_request_rate is None
    assert p.target.replicas is None and p.target.gpus is None
    assert not p.rate.met and "misses the SLO" in p.rate.why and "ttft" in p.rate.why


def test_rate_is_served_by_the_smallest_concurrency_littles_law():
    pm = model()
    st = pm.steps(I, O)

    def rate(c):
        return c / (st.ttft(c) + 255 * st.tpot(c))

    p = make_plan(pm, "qwen2.5-7b", I, O, rate=20.0)
    r = p.rate
    assert r.met and rate(r.concurrency - 1) < 20.0 <= rate(r.concurrency)
    assert r.concurrency == 16  # 20 req/s x 0.79 s E2E = 15.8 in flight
    assert p.points[0].concurrency == 16
    # beyond what fits: the ~94.9 req/s compute ceiling (each request ~10.4 TFLOP of prefill and decode)
    far = make_plan(pm, "qwen2.5-7b", I, O, rate=200.0).rate
    assert not far.met and far.concurrency is None and "94.87 req/s" in far.why


def test_target_rate_needs_replicas_times_tp_gpus():
    slo = {"ttft": 200, "tpot": 50}
    p = make_plan(model(), "qwen2.5-7b", I, O, slo=slo, target_rate=1000)
    t = p.target
    assert t.rate_per_replica == pytest.approx(p.slo.max_request_rate)
    assert t.replicas == math.ceil(1000 / t.rate_per_replica) == 11 and t.gpus == 11
    t2 = make_plan(model(tp=2), "qwen2.5-7b", I, O, slo=slo, target_rate=1000).target
    assert t2.gpus == 2 * t2.replicas == 2 * math.ceil(1000 / t2.rate_per_replica)


def test_weights_that_do_not_fit_are_a_user_error():
    gpu = get_gpu("h200", with_measured=False)
    pm = PlanModel(gpu, build_cost(resolve_model("qwen2.5-72b")))
    with pytest.raises(UserError, match=r"145.41 GB of weights per GPU .* raise --tp"):
        make_plan(pm, "qwen2.5-72b", I, O)


# ------------------------------------------------------------------------------------------------- calibration
# decode efficiency (floor TPOT / measured) and prefill efficiency (floor TTFT / measured) chosen for each run
EFF = {1: (0.5, 0.8), 16: (0.4, 0.5), 64: (0.6, 0.25)}


def results_file(tmp_path, effs=EFF, gpu="h200", model_name="qwen2.5-7b", fmt="bf16", extra_runs=()):
    """A `llmrs bench` results file written by hand: measured means = the floor of each run's shape / efficiency,
    output throughput 90% of what those latencies give by Little's law."""
    st = model().steps(I, O)
    runs = []
    for c, (d, p) in effs.items():
        ttft, tpot = st.ttft(c) / p, st.tpot(c) / d
        tput = 0.9 * c / (ttft + 255 * tpot) * 256
        runs.append({
            "tag": f"c={c}", "concurrency": c, "request_rate": "inf",
            "summary": {"completed": 200, "duration_s": 60.0, "output_throughput": tput,
                        "ttft_ms": {"mean": ttft * 1e3, "median": ttft * 1e3, "percentiles": {"p99": ttft * 2e3}},
                        "tpot_ms": {"mean": tpot * 1e3, "median": tpot * 1e3, "percentiles": {"p99": tpot * 2e3}}},
            "roofline": {"schema": "llmrs.roofline-grade/1", "graded": True, "gpu": gpu, "model": model_name,
                         "weight_format": fmt, "mean_decode_batch": c * 0.95, "mean_context": 640,
                         "decode_floor_ms": st.mixed(c, 0) * 1e3, "output_tok_s": tput},
        })
    runs.extend(extra_runs)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": "llmrs.bench/1", "params": {"input_len": I, "output_len": O},
                                "runs": runs}))
    return path


def test_calibration_fits_the_efficiencies_and_scales_the_predictions(tmp_path):
    ungraded = {"tag": "c=256", "concurrency": 256, "summary": {},
                "roofline": {"graded": False, "why": "no request completed"}}
    pm = model()
    cal = calibrate(pm, results_file(tmp_path, extra_runs=[ungraded]), "qwen2.5-7b")
    assert cal.decode_efficiency == pytest.approx((0.5 + 0.4 + 0.6) / 3)
    assert cal.prefill_efficiency == pytest.approx(0.8) and cal.prefill_from == "c=1"  # the lowest concurrency
    assert cal.skipped == ["c=256: not graded (no request completed)"]
    p = make_plan(pm, "qwen2.5-7b", I, O, concurrency=32, calibration=cal, slo={"tpot": 10})
    pt = p.points[0]
    assert pt.calibrated.tpot_s == pytest.approx(pt.floor.tpot_s / 0.5)
    assert pt.calibrated.ttft_s == pytest.approx(pt.floor.ttft_s / 0.8)
    assert pt.calibrated.e2e_s == pytest.approx(pt.floor.ttft_s / 0.8 + 255 * pt.floor.tpot_s / 0.5)
    assert pt.calibrated.request_rate == pytest.approx(32 / pt.calibrated.e2e_s)
    # the SLO is judged on the calibrated figures: TPOT 3.2 ms floor, 6.4 ms calibrated
    assert p.basis == p.slo.basis == "calibrated" and pt.meets_slo == (pt.calibrated.tpot_s <= 0.010)
    floor_only = make_plan(pm, "qwen2.5-7b", I, O, slo={"tpot": 10}).slo.max_concurrency
    assert p.slo.max_concurrency < floor_only


def test_leave_one_out_error_worked_by_hand(tmp_path):
    pm = model()
    st = pm.steps(I, O)
    cal = calibrate(pm, results_file(tmp_path), "qwen2.5-7b")
    runs = {r.tag: r for r in cal.runs}
    # TPOT of each run from the others' mean decode efficiency: measured = floor / own, predicted = floor / others'
    assert runs["c=1"].loo_tpot_error == pytest.approx(0.5 / ((0.4 + 0.6) / 2) - 1)  # 0
    assert runs["c=16"].loo_tpot_error == pytest.approx(0.4 / 0.55 - 1)  # -27.3%
    assert runs["c=64"].loo_tpot_error == pytest.approx(0.6 / 0.45 - 1)  # +33.3%
    assert cal.tpot_error_mean == pytest.approx((0 + (1 - 0.4 / 0.55) + (0.6 / 0.45 - 1)) / 3)  # 20.2%
    assert cal.tpot_error_max == pytest.approx(0.6 / 0.45 - 1)
    # output tok/s: the prefill efficiency comes from the lowest concurrency among the others
    errs = []
    for c, d_others, p_others in ((1, 0.5, 0.5), (16, 0.55, 0.8), (64, 0.45, 0.8)):
        d, p = EFF[c]
        measured = 0.9 * c / (st.ttft(c) / p + 255 * st.tpot(c) / d) * 256
        predicted = c / (st.ttft(c) / p_others + 255 * st.tpot(c) / d_others) * 256
        assert runs[f"c={c}"].loo_output_tok_s == pytest.approx(predicted)
        errs.append(predicted / measured - 1)
        assert runs[f"c={c}"].loo_output_tok_s_error == pytest.approx(errs[-1])
    assert cal.output_tok_s_error_mean == pytest.approx(sum(map(abs, errs)) / 3)
    assert cal.output_tok_s_error_max == pytest.approx(max(map(abs, errs)))


def test_one_run_calibrates_with_an_unknown_error(tmp_path):
    cal = calibrate(model(), results_file(tmp_path, effs={16: (0.4, 0.5)}), "qwen2.5-7b")
    assert cal.decode_efficiency == pytest.approx(0.4) and cal.prefill_efficiency == pytest.approx(0.5)
    assert cal.tpot_error_mean is None and cal.output_tok_s_error_mean is None


def test_a_rate_limited_run_counts_its_mean_decode_batch_as_its_concurrency(tmp_path):
    path = results_file(tmp_path, effs={8: (0.5, 0.5), 32: (0.5, 0.5)})
    doc = json.loads(path.read_text())
    doc["runs"][1].update({"concurrency": None, "request_rate": 12.0})  # an open-loop run: 32 x 0.95 in flight
    path.write_text(json.dumps(doc))
    runs = calibrate(model(), path, "qwen2.5-7b").runs
    assert [r.concurrency for r in runs] == [8, pytest.approx(30.4)]
    assert runs[1].floor_tpot_s == pytest.approx(model().steps(I, O).tpot(30.4))


def test_a_served_repo_id_names_the_same_preset(tmp_path):
    cal = calibrate(model(), results_file(tmp_path, model_name="Qwen/Qwen2.5-7B-Instruct"), "qwen2.5-7b")
    assert len(cal.runs) == 3


@pytest.mark.parametrize("kw, needle", [
    (dict(gpu="h100-sxm"), "graded on GPU 'h100-sxm', not 'h200'"),
    (dict(model_name="qwen2.5-3b"), "graded for model 'qwen2.5-3b', not 'qwen2.5-7b'"),
    (dict(fmt="awq"), "graded with awq weights, not bf16 (pass --format awq)"),
    (dict(effs={}), "no graded runs"),
])
def test_calibration_refuses_runs_of_another_setup(tmp_path, kw, needle):
    with pytest.raises(UserError) as e:
        calibrate(model(), results_file(tmp_path, **kw), "qwen2.5-7b")
    assert needle in str(e.value)


def test_calibration_refuses_a_file_whose_runs_are_all_ungraded(tmp_path):
    path = results_file(tmp_path, effs={}, extra_runs=[{"tag": "c=8", "roofline": {"graded": False,
                                                                                    "why": "no model config"}}])
    with pytest.raises(UserError, match=r"no graded runs .*c=8: not graded \(no model config\)"):
        calibrate(model(), path, "qwen2.5-7b")


# ------------------------------------------------------------------------------------------------------- the CLI
PLAN = ("plan", "--gpu", "h200", "--model", "qwen2.5-7b", "--input-len", "512", "--output-len", "256")


def test_cli_table_labels_every_figure_floor_or_calibrated(tmp_path):
    p = llmrs(*PLAN, "--slo", "ttft=200,tpot=50", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for s in ("at most 2,535 requests in flight", "44.0 MB per request", "TTFT floor", "TPOT floor",
              "out tok/s floor", "SLO ttft <= 200 ms, tpot <= 50 ms (floor)", "met", "missed"):
        assert s in out, s
    assert "calibrated" not in out.split("not counted")[0]
    c = llmrs(*PLAN, "--calibrate", str(results_file(tmp_path)), "-c", "32", cache=tmp_path)
    assert c.returncode == 0, c.stderr
    for s in ("decode efficiency 0.500", "prefill efficiency 0.800",
              "leave-one-out over 3 runs", "TPOT 20.2% mean, 33.3% max"):
        assert s in c.stdout, s
    rows = [ln for ln in c.stdout.splitlines() if ln.startswith("│") and " ms " in ln]
    labels = [ln.split("│")[4].strip() for ln in rows[-2:]]  # concurrency 32: a floor row, then a calibrated one
    assert labels == ["floor", "calibrated"]
    one = llmrs(*PLAN, "--calibrate", str(results_file(tmp_path, effs={16: (0.4, 0.5)})), cache=tmp_path)
    assert one.returncode == 0 and "calibration error: unknown" in one.stdout


def test_cli_json_matches_the_model(tmp_path):
    p = llmrs(*PLAN, "--slo", "ttft=200,tpot=50", "--rate", "20", "--target-rate", "1000", "--json", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["memory"]["max_concurrency"] == 2535 and j["memory"]["kv_bytes_per_request"] == 44_040_192
    assert j["basis"] == "floor" and j["calibration"] is None
    assert j["rate"]["met"] and j["rate"]["concurrency"] == 16
    assert j["target"]["gpus"] == 11
    (pt,) = j["points"]  # --rate shows the concurrency that serves it
    assert pt["concurrency"] == 16 and pt["calibrated"] is None and pt["meets_slo"] is True
    assert set(pt["floor"]) == {"ttft_s", "tpot_s", "e2e_s", "request_rate", "output_tok_s"}
    ref = make_plan(model(), "qwen2.5-7b", I, O, concurrency=16).points[0].floor
    assert pt["floor"]["tpot_s"] == pytest.approx(ref.tpot_s) and pt["floor"]["ttft_s"] == pytest.approx(ref.ttft_s)
    assert j["slo"]["max_concurrency"] == make_plan(model(), "qwen2.5-7b", I, O,
                                                   slo={"ttft": 200, "tpot": 50}).slo.max_concurrency


@pytest.mark.parametrize("args, needle", [
    (["plan", "--gpu", "nope", "--model", "qwen2.5-7b"], "unknown GPU"),
    (["plan", "--gpu", "h200", "--model", "gpt-5"], "unknown model"),
    ([*PLAN, "--rate", "5", "--concurrency", "8"], "give --rate or --concurrency, not both"),
    ([*PLAN, "--slo", "ttft=fast"], "--slo: bad SLO 'ttft=fast'"),
    ([*PLAN, "--slo", "latency=5"], "expected KEY=MS with KEY in ttft, tpot, e2el"),
    (["plan", "--gpu", "h200"], "llmrs plan needs a MODEL"),
    (["plan", "--gpu", "h200", "--model", "qwen2.5-72b"], "raise --tp or pick a smaller --format"),
    ([*PLAN, "--gpu-memory-utilization", "1.5"], "expected a fraction in (0, 1]"),
    ([*PLAN, "--calibrate", "missing.json"], "--calibrate missing.json: No such file"),
])
def test_cli_user_mistakes_print_one_line_and_exit_2(tmp_path, args, needle):
    p = llmrs(*args, cache=tmp_path)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_cli_calibration_for_another_gpu_names_it(tmp_path):
    p = llmrs(*PLAN, "--calibrate", str(results_file(tmp_path, gpu="h100-sxm")), cache=tmp_path)
    assert p.returncode == 2 and "graded on GPU 'h100-sxm', not 'h200' (--gpu)" in p.stderr
