"""Measured points to lay over a roofline: `llmrs roofline --measured FILE`.

Schema (JSON): either a list of points or an object with a "points" list. Each point is one of
  {"label": "llmrs bf16", "batch": 64, "tokens_per_s": 3000.0, "context": 400}   # decode throughput
  {"label": "gemm 4096^3", "flops": 1.37e11, "bytes": 1.0e8, "seconds": 0.0021}   # one kernel / step
A throughput point is placed with the cost model's bytes and FLOPs of a decode step at that batch (and at
"context", default --context): achieved FLOP/s = tokens_per_s * FLOPs per token. A kernel point is placed
from its own counts. `batch` is optional on kernel points; "context" is optional everywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrs.errors import UserError
from llmrs.roofline.analysis import Roofs
from llmrs.roofline.cost import ModelCost


@dataclass(slots=True)
class MeasuredPoint:
    """A measured point placed on the roofline, with the fraction of the ceiling it reaches."""

    label: str
    batch: int | None
    intensity: float  # FLOP/byte
    achieved_flops: float  # FLOP/s
    tokens_per_s: float | None
    ceiling_flops: float  # roofline at this intensity
    fraction_of_ceiling: float


def load_points(path: Path) -> list[dict[str, Any]]:
    """Read and validate the file; UserError naming the bad point."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: a directory; expected a JSON file of measured points") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a JSON text file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    points = data.get("points") if isinstance(data, dict) else data
    if not isinstance(points, list) or not points:
        raise UserError(f"{path}: expected a list of points or {{\"points\": [...]}} (see --help)")
    for i, p in enumerate(points):
        if not isinstance(p, dict) or "label" not in p:
            raise UserError(f"{path}: point {i} needs a \"label\"")
        has_tps = "tokens_per_s" in p and "batch" in p
        has_counts = all(k in p for k in ("flops", "bytes", "seconds"))
        if not (has_tps or has_counts):
            raise UserError(f"{path}: point {p['label']!r} needs batch + tokens_per_s, or flops + bytes + seconds")
    return points


def place_points(points: list[dict[str, Any]], cost: ModelCost, roofs: Roofs, context: int) -> list[MeasuredPoint]:
    """Put each raw point on the roofline of this model and these roofs."""
    out = []
    for p in points:
        try:
            if "flops" in p:
                flops, nbytes, secs = float(p["flops"]), float(p["bytes"]), float(p["seconds"])
                intensity, achieved, tps = flops / nbytes, flops / secs, None
            else:
                batch, tps = int(p["batch"]), float(p["tokens_per_s"])
                if batch < 1 or not tps > 0:
                    raise ValueError(f"batch {batch} and tokens_per_s {tps:g} must be positive")
                step = cost.decode_step(batch, int(p.get("context", context)))
                intensity, achieved = step.intensity, tps * step.flops / batch
            if not (intensity > 0 and achieved > 0):
                raise ValueError("flops, bytes and seconds must be positive")
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise UserError(f"measured point {p.get('label')!r}: bad number ({e})") from None
        ceiling = min(roofs.peak_flops, roofs.bandwidth * intensity)
        out.append(MeasuredPoint(label=str(p["label"]), batch=p.get("batch"), intensity=intensity,
                                 achieved_flops=achieved, tokens_per_s=tps, ceiling_flops=ceiling,
                                 fraction_of_ceiling=achieved / ceiling))
    return out
