"""How much of its rank a drafter's Markov head uses, and what its tables cost to ship: the singular values of the
head's bias B = W1 W2^T ([V, V] of rank r, from the r x r product of W1's and W2's QR factors), the energy its last
components carry, how many rows of W1 training moved away from their initialisation (a row of a token no training
sequence showed stays at its initial scale, std 0.02 per entry), and the xz size of W1 and W2 in bfloat16. Reads the
drafter on the CPU; writes OUT_DIR/markov_head_spectrum.json and prints it.

    python bench/markov_head_spectrum.py OUT_DIR [drafter=builtin:dspark-smollm2] [tail=8] [moved=NORM]

``moved``: a W1 row whose norm exceeds this counts as trained; default 1.35 x 0.02 x sqrt(r), the initial rows' norm
(0.11 at rank 32) with a margin. A head grown by ``init_grow_markov_rank`` starts its new columns at zero, so its
untrained rows sit lower still.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def spectrum(w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The singular values of W1 W2^T (W1 [V, r], W2 [V, r]), largest first, without forming the [V, V] matrix."""
    _, r1 = torch.linalg.qr(w1.double())
    _, r2 = torch.linalg.qr(w2.double())
    return torch.linalg.svdvals(r1 @ r2.T)


def xz_bytes(t: torch.Tensor) -> int:
    return len(lzma.compress(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes(), preset=9 | lzma.PRESET_EXTREME))


def main(argv: list[str]) -> dict:
    from dspark.bench.script_args import out_and_options

    out, opts = out_and_options(argv, __doc__, ("drafter", "tail", "moved"))
    from dspark.config import ModelConfig
    from dspark.models.drafter import DSparkDrafter
    from runners.common import resolve_drafter_path

    path = resolve_drafter_path(opts.get("drafter", "builtin:dspark-smollm2"), key="drafter")
    target = ModelConfig.from_dict(json.loads((Path(path) / "config.json").read_text())["target"])
    drafter = DSparkDrafter.load(path, target, device="cpu", dtype=torch.float32)
    if drafter.markov_head is None or drafter.markov_head.variant != "vanilla":
        raise SystemExit(f"{path}: no vanilla Markov head to read")
    w1, w2 = drafter.markov_head.w1.weight.detach(), drafter.markov_head.w2.weight.detach()
    s = spectrum(w1, w2)
    rank = w1.shape[1]
    try:
        tail = int(opts.get("tail", 8))
        moved = float(opts.get("moved", 1.35 * 0.02 * rank ** 0.5))
    except ValueError as e:
        raise SystemExit(f"tail= takes an integer and moved= a number: {e}") from None
    if not 1 <= tail < rank or not moved > 0:
        raise SystemExit(f"tail= must be in [1, {rank - 1}] (components after the first) and moved= > 0; "
                         f"got tail={tail}, moved={moved}")
    rest = s[1:] ** 2  # the first component is a shift most tokens share; the rest carry the per-token structure
    result = {
        "drafter": str(path), "vocab": int(w1.shape[0]), "rank": int(rank),
        "singular_values": [round(float(v), 2) for v in s],
        f"energy_share_of_last_{tail}_beyond_the_first": float(rest[-tail:].sum() / rest.sum()),
        "last_over_second": float(s[-1] / s[1]),
        "w1_rows_moved": int((w1.norm(dim=1) > moved).sum()), "w1_row_norm_threshold": round(moved, 4),
        "xz_bytes_bf16": {"w1": xz_bytes(w1), "w2": xz_bytes(w2)},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "markov_head_spectrum.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
