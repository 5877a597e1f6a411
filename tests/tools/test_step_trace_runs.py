"""tools/step_trace_runs.py on a trace file it reads as llmrs/trace.py writes them: runs split at gaps, the
prefill burst's times, the decode step median and the eager steps' host enqueue, per run."""

from tools import step_trace_runs


def test_two_runs_with_a_slower_first_burst(tmp_path):
    lines, t = [], 100.0
    for run, prefill_s in enumerate((0.20, 0.15)):  # run 1's eight prefill steps slower
        for s in range(100):
            lines.append(f"{t:.6f} 7 core_step")
            if s < 12:  # eager steps: the forward's host tags, 3.5 / 3.0 ms apart
                q = t + 1e-4 + (0.0035 if run == 0 else 0.003)
                lines += [f"{t + 1e-4:.6f} 7 fwd_begin", f"{q:.6f} 7 fwd_queued"]
            t += prefill_s if s < 8 else 0.0095
        t += 2.5
    lines.append("not a trace line")
    path = tmp_path / "trace.log"
    path.write_text("\n".join(lines) + "\n")
    r1, r2 = step_trace_runs.summary(str(path))
    assert r1["steps"] == r2["steps"] == 100
    assert r1["to_step8_ms"] == 1400.0 and r2["to_step8_ms"] == 1050.0  # 7 intervals
    assert r1["to_step16_ms"] == 1666.5  # 8 prefill intervals of 200 ms, then 7 of 9.5
    assert r1["decode_step_ms"] == r2["decode_step_ms"] == 9.5
    assert (r1["eager_steps"], r1["eager_enqueue_ms"], r2["eager_enqueue_ms"]) == (12, 3.5, 3.0)
    assert len(step_trace_runs.summary(str(path), gap=10.0)) == 1  # one run when no gap is long enough
