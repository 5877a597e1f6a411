"""The GPU database: every number sourced, dense figures consistent, NVML names matched, measured overlay."""

import json

import pytest

from llmrs.errors import UserError
from llmrs.roofline.gpus import NUMERIC_FIELDS, get_gpu, load_gpus, match_gpu_name, measure_local_gpu
from llmrs.roofline.measured import Measurement, cache_path, load_measured, save_measurement

REQUIRED = {"rtx-a5000", "rtx-2000-ada", "rtx-3090", "rtx-4090", "a10", "l4", "l40s", "a100-40gb-sxm",
            "a100-40gb-pcie", "a100-80gb-sxm", "a100-80gb-pcie", "h100-sxm", "h100-pcie", "h200", "b200"}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMRS_CACHE_DIR", str(tmp_path / "cache"))


def test_database_has_every_gpu_of_the_issue():
    assert REQUIRED <= {g.key for g in load_gpus()}


def test_every_number_has_a_source():
    for g in load_gpus():
        for f in NUMERIC_FIELDS:
            if getattr(g, f) is not None:
                assert g.sources.get(f), f"{g.key}.{f} has no source"
        for f in g.derived:
            assert f in NUMERIC_FIELDS and getattr(g, f) is not None


def test_sparse_figures_are_halved_and_marked():
    h100 = get_gpu("h100-sxm")
    assert h100.bf16_tflops == pytest.approx(1979 / 2)
    assert "sparsity" in h100.derived["bf16_tflops"]
    assert get_gpu("rtx-4090").bf16_tflops == pytest.approx(165.2)  # GeForce: half rate with FP32 accumulate
    assert "half" in get_gpu("rtx-4090").derived["bf16_tflops"]
    assert get_gpu("a100-80gb-sxm").fp8_tflops is None  # Ampere has no FP8 tensor cores


@pytest.mark.parametrize("nvml_name,key", [
    ("NVIDIA RTX A5000", "rtx-a5000"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"), ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"), ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA A10", "a10"),
    ("NVIDIA RTX 2000 Ada Generation", "rtx-2000-ada"),
])
def test_nvml_names_match_their_entry(nvml_name, key):
    assert match_gpu_name(nvml_name).key == key


def test_l40_is_not_mistaken_for_l4_and_unknown_names_fail():
    assert match_gpu_name("NVIDIA L40") is None
    assert match_gpu_name("Radeon RX 7900") is None
    with pytest.raises(UserError, match="unknown GPU"):
        get_gpu("voodoo-2")


def test_measured_ceilings_are_stored_beside_the_datasheet(tmp_path):
    m = Measurement(gpu_key="rtx-a5000", device_name="NVIDIA RTX A5000", bandwidth_gbs=690.0, bf16_tflops=95.0,
                    copy_bytes=1 << 30, gemm_shape=(8192, 8192, 8192), gemm_dtype="bf16", measured_at="now")
    path = save_measurement(m)
    assert path == cache_path() and path.parent == tmp_path / "cache"
    assert load_measured()["rtx-a5000"]["bandwidth_gbs"] == 690.0
    g = get_gpu("rtx-a5000")
    assert g.bandwidth_gbs == 768 and g.measured_bandwidth_gbs == 690.0
    assert g.bandwidth(measured=True) == 690e9 and g.bandwidth(measured=False) == 768e9
    assert g.ridge("bf16", measured=True) == pytest.approx(95e12 / 690e9)
    assert json.loads(path.read_text())["rtx-a5000"]["gemm_shape"] == [8192, 8192, 8192]


def test_measure_without_cupy_or_gpu_is_a_clear_user_error():
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: --measure is exercised on the GPU machine")
    except ImportError:
        pass
    with pytest.raises(UserError, match="CuPy"):
        measure_local_gpu()
