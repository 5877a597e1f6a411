"""One way to name a model in every command that takes one: positional MODEL or --model / -m (as `vllm serve M`
and `--model M`); both only when they agree; --synthetic or --from instead of a model is still one choice."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import assert_user_error, llmrs


def test_info_takes_model_positional_or_as_option(tiny_qwen2):
    outs = [llmrs("info", *args, "--json") for args in ([str(tiny_qwen2)], ["--model", str(tiny_qwen2)],
                                                          ["-m", str(tiny_qwen2)],
                                                          [str(tiny_qwen2), "--model", str(tiny_qwen2)])]
    for res in outs:
        assert res.returncode == 0, res.stderr
    docs = [json.loads(r.stdout) for r in outs]
    assert all(d == docs[0] for d in docs) and docs[0]["architecture"] == "qwen2"


def test_info_without_a_model_is_the_embedded_default():
    res = llmrs("info", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["model"] == "smollm2-135m"


def test_two_different_models_are_one_clear_error(tiny_llama, tiny_qwen2):
    for cmd in (["info"], ["generate", "-p", "hi"], ["chat"], ["profile"], ["roofline", "--gpu", "h200"]):
        assert_user_error(llmrs(*cmd, str(tiny_llama), "--model", str(tiny_qwen2)), "two models given")


@pytest.mark.parametrize("form", ["positional", "option"])
def test_generate_and_chat_take_model_either_way(tiny_llama, form):
    model = [str(tiny_llama)] if form == "positional" else ["--model", str(tiny_llama)]
    res = llmrs("generate", *model, "-p", "Hello world", "--max-tokens", "4")
    assert res.returncode == 0, res.stderr
    assert "4 tokens" in res.stderr and tiny_llama.name in res.stderr  # "loaded llama in ..."
    res = llmrs("chat", *model, "--max-tokens", "2", input="Hello\n\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("tokens,") == 1


def test_generate_model_and_synthetic_are_one_choice(tiny_llama):
    assert_user_error(llmrs("generate", str(tiny_llama), "--synthetic", "qwen2.5-7b", "-p", "hi"), "--synthetic")


def test_profile_names_its_model_either_way_before_needing_a_gpu(tmp_path):
    """profile resolves the model before it looks for a GPU: a mistyped one is named whichever way it was given."""
    for args in (["no-such-model-dir"], ["--model", "no-such-model-dir"], ["-m", "no-such-model-dir"]):
        res = llmrs("profile", *args)
        assert_user_error(res, "no-such-model-dir")
    assert_user_error(llmrs("profile", "x", "--synthetic", "qwen2.5-7b"), "exactly one of")


def test_synth_takes_the_preset_positional_or_as_like_or_model():
    for args in (["smollm2-135m"], ["--like", "smollm2-135m"], ["--model", "smollm2-135m"], ["-m", "smollm2-135m"]):
        # the preset is accepted (the next thing asked for is what to do with it)
        assert_user_error(llmrs("synth", *args), "--out DIR")
    assert_user_error(llmrs("synth", "no-such-preset", "--out", "x"), "unknown model preset")
    assert_user_error(llmrs("synth", "--out", "x"), "name the preset")
    assert_user_error(llmrs("synth", "smollm2-135m", "--like", "qwen2.5-7b"), "two models given")


def test_serve_takes_one_model_and_synthetic_replaces_it():
    assert_user_error(llmrs("serve", "a-model", "--model", "another"), "two models given")
    assert_user_error(llmrs("serve", "--model", "a-model", "--synthetic", "qwen2.5-7b"), "--synthetic", "replaces MODEL")
