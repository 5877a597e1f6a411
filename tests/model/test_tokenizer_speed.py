"""tools/tokenizer_speed.py: each call form's median for one random-token and one English prompt, in JSON, and
the forms agree on the ids (it times what the server's Tokenizer.encode does against the library's other calls)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tokenizer_speed_writes_every_form_and_environment(tmp_path):
    out = tmp_path / "tok.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "tokenizer_speed.py"), "--model",
                        "synthetic:qwen2.5-0.5b", "--tokens", "32", "--rounds", "14", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert json.loads(r.stdout.strip().splitlines()[-1]) == res
    assert res["env"] == {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": None}
    assert set(res["us"]) == {f"{f} {p}" for f in ("encode_batch_fast", "encode", "encode_batch")
                              for p in ("random", "english")}
    assert all(v > 0 for v in res["us"].values())
    assert res["tokens"]["random"] >= 32 and res["tokens"]["english"] >= 20
    assert res["same_ids"] is True
