"""`llmrs roofline --tp N`: per-GPU floors divided by N and the all-reduce share, through the real CLI."""

import json

import pytest

from tests.roofline.test_roofline_cli import llmrs


def tp_json(tmp_path, *args):
    p = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-72b", "--batch", "1,64", "--context", "512",
              "--json", *args, cache=tmp_path)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_tp_divides_weights_and_kv_and_adds_ring_all_reduce_time(tmp_path, n):
    j = tp_json(tmp_path, "--tp", str(n))
    t, base = j["tensor_parallel"], {p["batch"]: p for p in j["points"]}
    assert t["tp"] == n and t["link_gbs"] == 450 and "NVLink 900 GB/s" in t["link_source"]
    assert t["allreduces_per_step"] == 160  # Qwen2.5-72B: 80 layers x 2
    assert t["checkpoint_bytes_per_gpu"] == pytest.approx(j["checkpoint_bytes"] / n)
    bw = 4800e9
    for p in t["points"]:
        b = p["batch"]
        payload = 2 * 80 * b * 8192 * 2  # 2 per layer x layers x tokens x hidden x bf16
        assert p["allreduce_bytes"] == payload
        assert p["ring_bytes_per_gpu"] == pytest.approx(payload * 2 * (n - 1) / n)
        assert p["comm_s"] == pytest.approx(payload * 2 * (n - 1) / n / 450e9)
        assert p["weight_bytes_per_gpu"] == pytest.approx(base[b]["weight_bytes"] / n)
        assert p["kv_bytes_per_gpu"] == pytest.approx(base[b]["kv_bytes"] / n)
        assert p["memory_s"] == pytest.approx(base[b]["bytes"] / n / bw)
        assert p["compute_s"] == pytest.approx(base[b]["compute_s"] / n)
        assert p["step_s"] == pytest.approx(max(p["memory_s"], p["compute_s"]) + p["comm_s"])
        assert p["comm_share"] == pytest.approx(p["comm_s"] / p["step_s"])
    one = t["points"][0]
    # batch 1, TP=2: 2.62 MB all-reduced per token; the ring moves all of it at N=2: 5.8 us over 450 GB/s
    if n == 2:
        assert one["allreduce_bytes"] == 2_621_440 and one["comm_s"] == pytest.approx(5.825e-6, rel=1e-3)
        assert one["fits"] and not base[1]["fits"]  # 145 GB of bf16 weights: one H200 no, two yes


def test_tp_table_shows_the_communication_share(tmp_path):
    p = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-72b", "--batch", "1,256", "--tp", "2", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    for s in ("tensor parallel x2", "160 all-reduces per step", "comm share", "72.71 GB of weights per GPU"):
        assert s in p.stdout, s


def test_tp_measured_link_overrides_the_datasheet(tmp_path):
    t = tp_json(tmp_path, "--tp", "2", "--tp-link-gbs", "300")["tensor_parallel"]
    assert t["link_gbs"] == 300 and t["link_source"] == "--tp-link-gbs"
    assert t["points"][0]["comm_s"] == pytest.approx(2_621_440 / 300e9)


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "h200", "--model", "qwen2.5-72b", "--tp", "3"], "does not divide the model's 8 KV heads"),
    (["--gpu", "rtx-a5000", "--model", "qwen2.5-7b", "--tp", "2"], "no NVLink figure"),
])
def test_tp_user_mistakes_exit_2(tmp_path, args, needle):
    p = llmrs("roofline", *args, cache=tmp_path)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr


def test_without_tp_the_json_is_unchanged(tmp_path):
    assert "tensor_parallel" not in tp_json(tmp_path)
