"""Config fields that change a model's math and that llmrs does not implement are refused with a clear error, never
ignored (a Mistral with a sliding window computed with full attention gives wrong tokens past the window). The
configs are the ones transformers itself writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _hf(cls, **kw) -> dict:
    d = cls(**SMALL, **kw).to_dict()
    d.setdefault("model_type", cls.model_type)
    return d


def test_a_mistral_sliding_window_is_refused_naming_the_field():
    with pytest.raises(UserError, match=r"sliding_window = 8: sliding-window attention .* last 8 tokens"):
        ModelConfig.from_hf_dict(_hf(MistralConfig, sliding_window=8))


@pytest.mark.parametrize("cls, kw", [
    (MistralConfig, dict(sliding_window=None)),  # Mistral v0.2 and later: no window
    (MistralConfig, dict(sliding_window=256)),  # a window as long as the context: full attention, same math
    (Qwen2Config, dict(sliding_window=8, use_sliding_window=False)),  # Qwen2.5's configs: a window that is off
    (LlamaConfig, dict()),
])
def test_fields_that_leave_the_math_unchanged_are_accepted(cls, kw):
    c = ModelConfig.from_hf_dict(_hf(cls, **kw))
    assert c.hidden_size == 32 and c.num_hidden_layers == 2


@pytest.mark.parametrize("cls, kw, field", [
    (Qwen2Config, dict(sliding_window=8, use_sliding_window=True, max_window_layers=1), "sliding_window = 8"),
    (LlamaConfig, dict(hidden_act="gelu"), "hidden_act = 'gelu'"),
    (LlamaConfig, dict(mlp_bias=True), "mlp_bias = True"),
])
def test_other_unimplemented_fields_are_refused(cls, kw, field):
    with pytest.raises(UserError, match=field):
        ModelConfig.from_hf_dict(_hf(cls, **kw))


def test_llmrs_info_on_a_windowed_mistral_checkpoint_is_one_line(tmp_path):
    d = tmp_path / "mistral"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**_hf(MistralConfig, sliding_window=8),
                                               "architectures": ["MistralForCausalLM"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-m", "llmrs", "info", str(d)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "sliding_window = 8" in res.stderr and "does not implement" in res.stderr


def test_the_roofline_still_counts_a_windowed_model(tmp_path):
    """The roofline reads only shapes: a sliding window does not stop `llmrs roofline` on such a checkpoint."""
    from llmrs.roofline.model_source import resolve_model

    (tmp_path / "config.json").write_text(json.dumps(_hf(MistralConfig, sliding_window=8)))
    assert resolve_model(str(tmp_path)).config.num_hidden_layers == 2
