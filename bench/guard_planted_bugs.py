"""Do the A/B guards fail a wrong engine and pass the right one? runners.ab once per planted bug.

    python bench/guard_planted_bugs.py OUT [runners.ab overrides ...]

Runs the A/B of the overrides (default: target-only vs DSpark verify-all on mixed_chat) once with
the correct engines and once per bug of dspark/bench/planted_bugs.py planted in arm B, each in
OUT/<name>/ (ab.fail_on_guard=false: every run writes its summary). Writes OUT/planted_bugs.json
and OUT/planted_bugs.md: per run, whether the lossless guard passed, its evidence (noise bound,
real divergences, rate tests) and the expected outcome (pass for "correct", fail for each bug).
Exits 1 when any outcome is not the expected one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runners.ab as ab  # noqa: E402
from dspark.atomic import atomic_write_text  # noqa: E402
from dspark.bench.planted_bugs import PLANTED_BUGS, planted_engine_factory  # noqa: E402

DEFAULT = ["ab=spec_off_vs_dspark", "+workload=mixed_chat", "workload.num_prompts=64", "workload.max_tokens=128",
           "load.concurrency=16", "ab.n_blocks=1", "wandb.mode=disabled"]


def run_one(out: Path, name: str, overrides: list[str]) -> dict:
    folder = out / name
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3", job_name="ab"):
        cfg = compose(config_name="ab", overrides=[f"paths.root={ROOT}", f"paths.output_dir={folder}",
                                                   f"paths.cost_tables={ROOT / 'cost_tables'}", "progress=false",
                                                   "ab.fail_on_guard=false", "ab.force_rerun=true", *overrides])
    factory = None if name == "correct" else planted_engine_factory(name)
    summary = ab.run(cfg, engine_factory=factory)
    lossless = [g for g in summary["guards"] if g["name"].startswith("lossless")]
    d = lossless[0]["details"] if lossless else {}
    return {"run": name, "expected": "pass" if name == "correct" else "fail",
            "lossless_passed": all(g["passed"] for g in lossless), "guards_passed": summary["guards_passed"],
            "message": "; ".join(g["message"] for g in lossless), "delta": d.get("delta"),
            "delta_forward": d.get("delta_forward"), "delta_control": d.get("delta_control"),
            "real_divergences": d.get("real_divergence_count"), "control_flips": d.get("control_flip_count"),
            "rate_tests": d.get("rate_tests"), "comparisons": d.get("comparisons"),
            "tok_s_change_pct": summary["statistics"].get(ab.HEADLINE, {}).get("change_pct")}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    overrides = argv[1:] or DEFAULT
    rows = []
    for name in ("correct", *PLANTED_BUGS):
        try:
            rows.append(run_one(out, name, overrides))
        except Exception as exc:  # one run's crash must not hide the others' outcomes
            rows.append({"run": name, "expected": "pass" if name == "correct" else "fail", "lossless_passed": None,
                         "error": f"{type(exc).__name__}: {exc}", "rate_tests": None, "delta": None,
                         "delta_forward": None, "delta_control": None, "real_divergences": None})
    atomic_write_text(out / "planted_bugs.json", json.dumps({"overrides": overrides, "runs": rows}, indent=2,
                                                             default=str))
    lines = ["| run | expected | lossless guard | noise bound (forward / control) | real divergences | "
             "off-reference rate B vs control (Fisher p) |", "|---|---|---|---|---|---|"]
    ok = True
    for r in rows:
        got = {True: "pass", False: "fail", None: "error: " + str(r.get("error"))[:200]}[r["lossless_passed"]]
        ok &= got == r["expected"]
        rt = (r["rate_tests"] or {}).get("B")
        rate = f"{rt['rate']:.3%} vs {rt['control_rate']:.3%} (p={rt['p_value']:.2g})" if rt else "-"
        fmt = (lambda v: f"{v:.3g}" if isinstance(v, (int, float)) else "-")
        lines.append(f"| {r['run']} | {r['expected']} | **{got}** | {fmt(r['delta'])} ({fmt(r['delta_forward'])} / "
                     f"{fmt(r['delta_control'])}) | {r['real_divergences']} | {rate} |")
    atomic_write_text(out / "planted_bugs.md", "\n".join([f"`runners.ab {' '.join(overrides)}`", "", *lines, ""]))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
