"""bench/transformers_peer.py on the CPU: mode names and the hand-written static-cache loop (no compile)
against transformers' own greedy generate, with the real SmolLM2."""

import json

import pytest

from bench_scripts import load_bench_script

pytest.importorskip("transformers")


def _peer():
    return load_bench_script("transformers_peer")


def test_mode_names_and_alias():
    peer = _peer()
    assert peer._parse_modes("eager,static_generate,static_compiled_loop") == list(peer.MODES)
    assert peer._parse_modes("static_compiled,static_generate") == ["static_generate"]  # the old name
    with pytest.raises(SystemExit):
        peer._parse_modes("nope")
    assert peer._matching_prefix([1, 2, 3], [1, 2, 4]) == 2


@pytest.mark.slow
@pytest.mark.smollm2
def test_static_loop_matches_generate_on_cpu(tmp_path):
    peer = _peer()
    peer.main([str(tmp_path), "--device", "cpu", "--dtype", "float32", "--batches", "1,2", "--new-tokens", "6",
               "--modes", "static_compiled_loop", "--no-compile"])
    doc = json.loads((tmp_path / "transformers_peer.json").read_text())
    rows = doc["rows"]
    assert [(r["mode"], r["batch"], r["new_tokens"], r["generated_tokens"]) for r in rows] == [
        ("static_compiled_loop", 1, 6, 6), ("static_compiled_loop", 2, 6, 12)]
    # float32 on the CPU: the loop's greedy tokens equal generate's, also for a left-padded row
    assert all(r["ref_match_tokens"] == r["ref_tokens"] == 6 for r in rows)
    assert doc["loop_batch1_ref_match_tokens"] == 6
    assert rows[1]["prompt_len"] > rows[0]["prompt_len"]  # the first prompt is left-padded at batch 2
    assert {"torch", "transformers", "device_name"} <= set(doc)
    assert (tmp_path / "transformers_peer.md").exists()
