"""Engine commands: `llmrs generate`, `llmrs chat`, `llmrs info`."""

from __future__ import annotations

import sys
import time
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from llmrs.cli.options import model_argument, model_option, one_model
from llmrs.errors import UserError
from llmrs.model.loader import DEFAULT_MODEL

console = Console(stderr=True)

MODEL_HELP = "Embedded model name, Hugging Face-style directory, or .gguf file."
SYNTH_HELP = ("Instead of MODEL: a preset's exact shapes (e.g. qwen2.5-7b, see `llmrs roofline --help`) with "
              "random bf16 weights drawn on the GPU (needs --device cuda/auto with a GPU).")
DEQUANT_HELP = ("--keep-quantized (default): quantized linear weights (AWQ, GGUF Q4_0/Q4_1/Q8_0) stay packed on the "
                "GPU and run on the 4-bit kernels. --dequantize: they become bf16 at load (4x the weight memory; "
                "docs/quantization.md says when that is faster). The CPU always dequantizes.")
TP_HELP = ("GPUs to split the model across (Megatron-style tensor parallelism over NCCL, one process per GPU); "
           "must divide the model's KV heads.")


def synthetic_model(model: str, synthetic: str | None) -> str:
    """`--synthetic PRESET` is the model spec `synthetic:PRESET` (it also works directly as MODEL)."""
    from llmrs.model.loader import SYNTHETIC_PREFIX

    return SYNTHETIC_PREFIX + synthetic if synthetic else model


def _load_runner(model: str | None, device: str, max_len_hint: int, dequantize: bool = False):
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner

    t0 = time.perf_counter()
    with console.status(f"loading {model or DEFAULT_MODEL} ..."):
        loaded = load(model, keep_quantized=not dequantize)
        block_size = 16
        tokens = min(loaded.config.max_position_embeddings, max_len_hint)
        runner = ModelRunner(loaded, num_blocks=-(-tokens // block_size), block_size=block_size, device=device)
    console.print(f"[dim]loaded {loaded.source.name} in {time.perf_counter() - t0:.1f}s on {runner.device}[/dim]")
    return runner


def _params(max_tokens, temperature, top_p, top_k, seed):
    from llmrs.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)


def generate(
    model_arg: Optional[str] = model_argument(MODEL_HELP, show_default=DEFAULT_MODEL),
    prompt: str = typer.Option(..., "--prompt", "-p", help="Prompt text."),
    model: Optional[str] = model_option(),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt as a user message in the chat template."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = disabled."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for reproducible sampling."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    synthetic: Optional[str] = typer.Option(None, "--synthetic", help=SYNTH_HELP),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help=TP_HELP),
    dequantize: bool = typer.Option(False, "--dequantize/--keep-quantized", help=DEQUANT_HELP),
) -> None:
    """Generate text for one prompt, streamed as it is produced, then a one-line summary."""
    from llmrs.engine.runner import GenerationStats, stream_generate

    named = one_model(model_arg, model)
    if named and synthetic:
        raise UserError("--synthetic PRESET replaces MODEL: give one of them")
    model = synthetic_model(named or DEFAULT_MODEL, synthetic)
    params = _params(max_tokens, temperature, top_p, top_k, seed)
    params.validate()
    if tensor_parallel_size != 1:
        from llmrs.engine.tp_nccl import check_tp_size, tp_runner_for_generate

        check_tp_size(tensor_parallel_size, device)
        with console.status(f"loading {model} on {tensor_parallel_size} GPUs ..."):
            runner = tp_runner_for_generate(model, tensor_parallel_size, max_len_hint=10**9)
    else:
        runner = _load_runner(model, device, max_len_hint=10**9, dequantize=dequantize)
    tok = runner.loaded.tokenizer
    ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    stats = GenerationStats()
    t0 = time.perf_counter()
    finish = None
    for out in stream_generate(runner, ids, params, stats):
        sys.stdout.write(out.text)
        sys.stdout.flush()
        finish = out.finish_reason
    total = time.perf_counter() - t0
    sys.stdout.write("\n")
    console.print(
        f"[bold]{stats.output_tokens} tokens[/bold] in {total:.2f}s | prompt {stats.prompt_tokens} tok, "
        f"prefill {stats.prefill_s * 1000:.0f} ms | decode {stats.decode_tok_s:.1f} tok/s "
        f"({1000 / stats.decode_tok_s if stats.decode_tok_s else 0:.1f} ms/token) | finish: {finish}"
    )


def chat(
    model_arg: Optional[str] = model_argument(MODEL_HELP, show_default=DEFAULT_MODEL),
    model: Optional[str] = model_option(),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> None:
    """Interactive multi-turn chat with the model's chat template (empty line or Ctrl-D to quit)."""
    from llmrs.engine.runner import GenerationStats, stream_generate

    model = one_model(model_arg, model, DEFAULT_MODEL)
    params = _params(max_tokens, temperature, top_p, top_k, seed)
    params.validate()
    runner = _load_runner(model, device, max_len_hint=10**9)
    tok = runner.loaded.tokenizer
    if not tok.chat_template:
        raise UserError("this model has no chat template; use `llmrs generate` instead")
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            user = input(">>> ")
        except EOFError:
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        stats = GenerationStats()
        try:
            reply = []
            for out in stream_generate(runner, tok.encode_chat(messages), params, stats):
                sys.stdout.write(out.text)
                sys.stdout.flush()
                reply.append(out.text)
        except UserError as e:  # e.g. the conversation outgrew the context: say so, keep the session
            console.print(f"[red]error:[/red] {e}")
            messages.pop()
            continue
        sys.stdout.write("\n")
        console.print(f"[dim]{stats.output_tokens} tokens, {stats.decode_tok_s:.1f} tok/s[/dim]")
        messages.append({"role": "assistant", "content": "".join(reply)})


def info(
    model_arg: Optional[str] = model_argument(MODEL_HELP, show_default=DEFAULT_MODEL),
    model: Optional[str] = model_option(),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Architecture, parameter count, bytes by dtype, context length, chat template present or not."""
    import json

    from llmrs.model.loader import resolve
    from llmrs.model.tokenizer import Tokenizer

    src = resolve(one_model(model_arg, model, DEFAULT_MODEL))
    c = src.config
    if src.kind == "hf":
        from llmrs.model.weights import _read_safetensors_header, safetensors_files

        for f in safetensors_files(src.path):
            for name, meta in _read_safetensors_header(f).items():
                if not name.startswith("__"):
                    src.bytes_by_dtype[meta["dtype"]] = src.bytes_by_dtype.get(meta["dtype"], 0) + (
                        meta["data_offsets"][1] - meta["data_offsets"][0])
        has_template = Tokenizer.from_hf_dir(src.path).chat_template is not None
    else:
        has_template = bool(src.gguf and src.gguf.metadata.get("tokenizer.chat_template"))
    data = {
        "model": src.name, "path": str(src.path), "format": src.kind, "architecture": c.model_type,
        "parameters": c.num_parameters(), "layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "attention_heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
        "context_length": c.max_position_embeddings, "tied_embeddings": c.tie_word_embeddings,
        "qkv_bias": c.attention_bias, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "bytes_by_dtype": src.bytes_by_dtype, "kv_bytes_per_token_bf16": c.kv_bytes_per_token(2),
        "chat_template": has_template, "quantization": src.quant_label(),
    }
    if json_out:
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"llmrs info: {src.name}", show_header=False)
    for k, v in data.items():
        if k == "parameters":
            v = f"{v:,} ({v / 1e6:.1f} M)"
        elif k == "bytes_by_dtype":
            v = ", ".join(f"{d}: {b / 1e6:.1f} MB" for d, b in v.items())
        table.add_row(k, str(v))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("chat")(chat)
    app.command("info")(info)
