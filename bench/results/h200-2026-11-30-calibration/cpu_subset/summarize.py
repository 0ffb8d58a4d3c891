import json, sys
pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"
for name in sys.argv[1:]:
    r = json.load(open(f"/tmp/cal_bias/{name}/calibration.json"))
    b = r["bootstrap"]["ece_after"]; b0 = r["bootstrap"]["ece_before"]
    print(f"== {name}: method {r['method']}  sequences {r['sequences']} blocks {r['blocks']} split {r['split']['sequences']} {r['split']['blocks']}")
    print(f"  OOS ECE before {pct(r['ece_before'])} [{pct(b0['low'])}, {pct(b0['high'])}]  after {pct(r['ece_after'])} [{pct(b['low'])}, {pct(b['high'])}]  noise floor {pct(b['noise_floor'])}")
    print(f"  in-sample ECE after {pct(r['in_sample']['ece_after'])}   verdict: {r.get('target_ece_verdict')}")
    print("  OOS per-position ECE before:", [pct(v) for v in r["ece_before_per_position"]])
    print("  OOS per-position ECE after: ", [pct(v) for v in r["ece_after_per_position"]])
    print("  temperatures:", [round(t, 3) for t in r["temperatures"]], " biases:", [round(t, 3) for t in r.get("biases", [])])
    print("  AUC overall (raw):", round(r["auc_overall"], 4), " survival AUC before/after:",
          [round(v, 3) for v in r["survival_auc_before_per_position"]], [round(v, 3) for v in r["survival_auc_after_per_position"]])
    print("  Brier before/after:", [round(v, 4) for v in r["brier_before_per_position"]], [round(v, 4) for v in r["brier_after_per_position"]])
    print("  accept per position:", [round(v, 3) for v in r["acceptance_per_position"]], " greedy mean accept len:", round(r["greedy_mean_accept_length"], 3))
    if "previous_temperatures" in r:
        p = r["previous_temperatures"]; pb = p.get("bootstrap", {})
        print(f"  shipped temperatures on same report blocks: {pct(p['ece_after'])} [{pct(pb.get('low'))}, {pct(pb.get('high'))}]")
