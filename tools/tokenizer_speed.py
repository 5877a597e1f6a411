"""How long the server's tokenizer takes for one prompt, by call form: `Tokenizer.encode` uses
`encode_batch_fast([text])` (no offsets), against `encode` (offsets) and `encode_batch`; each in this process's
environment (run it with TOKENIZERS_PARALLELISM=false / RAYON_NUM_THREADS=1 to see what the rayon pool costs a
single prompt on a many-core host). Prompts: the text of N random token ids (what `llmrs bench`'s random dataset
sends) and an English passage of about the same token count.

    python -m tools.tokenizer_speed [--model synthetic:qwen2.5-7b] [--tokens 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmrs.model.loader import load  # noqa: E402

PASSAGE = ("Paged attention stores the keys and values of every sequence in fixed-size blocks, so memory is handed "
           "out as the sequence grows and nothing is reserved for tokens that never come. ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:qwen2.5-7b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tk = load(args.model).tokenizer.tk
    rng = np.random.default_rng(0)
    random_texts = [tk.decode(rng.integers(1000, 100_000, args.tokens).tolist()) for _ in range(50)]
    english = PASSAGE * max(1, args.tokens // len(tk.encode(PASSAGE).ids))
    forms = {
        "encode_batch_fast": lambda t: tk.encode_batch_fast([t])[0].ids,
        "encode": lambda t: tk.encode(t).ids,
        "encode_batch": lambda t: tk.encode_batch([t])[0].ids,
    }
    out = {"env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")},
           "cpus": os.cpu_count(), "tokenizers": __import__("tokenizers").__version__, "us": {}}
    for name, f in forms.items():
        for label, texts in (("random", random_texts), ("english", [english])):
            ts = []
            for i in range(args.rounds):
                t = texts[i % len(texts)]
                t0 = time.perf_counter()
                f(t)
                ts.append(time.perf_counter() - t0)
            out["us"][f"{name} {label}"] = round(statistics.median(ts[10:]) * 1e6, 1)
    out["tokens"] = {"random": len(tk.encode(random_texts[0]).ids), "english": len(tk.encode(english).ids)}
    # the forms must give the same ids, or the timing compares different work
    out["same_ids"] = all(len({tuple(f(t)) for f in forms.values()}) == 1 for t in random_texts + [english])
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
