"""bench/h200_session.sh, the DFlash ablation continued beside a shipped DSpark: its settings (STYLES=dflash alone,
INIT_FROM_DFLASH, SHARDS / ONLY_SHARD, PARTS) are refused with a reason before anything runs when they cannot make the
ablation's data or steps, and the accepted ones reach no phase (PHASES=none) without an error."""

from __future__ import annotations

import pytest

from session_script import run_session as session


@pytest.mark.parametrize("env, code, message", [
    ({"STYLES": "dspark dflash", "INIT_FROM": "builtin:dspark-smollm2"}, 2, "continue the ablation from its own"),
    ({"STYLES": "dspark", "INIT_FROM_DFLASH": "/w"}, 2, "trains no DFlash ablation"),
    ({"STYLES": "dflash", "PHASES": "data train finish"}, 2, "the finish phase ships DSpark"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "0"}, 2, "SHARDS=0: a whole number >= 1"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "2", "ONLY_SHARD": "2"}, 2, "from 0 to SHARDS-1 (1)"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "2", "ONLY_SHARD": "x"}, 2, "ONLY_SHARD=x"),
    ({"STYLES": "dflash", "PHASES": "data", "PARTS": "0"}, 2, "PARTS=0: a whole number >= 1"),
    ({"STYLES": "dflash", "PHASES": "data", "PARTS": "two"}, 2, "PARTS=two: a whole number >= 1"),
])
def test_settings_that_cannot_make_the_ablation_are_refused_first(tmp_path, env, code, message):
    refused = session(tmp_path, **env)
    assert refused.returncode == code and message in refused.stdout, refused.stdout + refused.stderr
    assert not (tmp_path / "work" / "site").exists()  # refused before the model was staged


@pytest.mark.parametrize("env", [
    {"STYLES": "dflash", "PHASES": "none", "INIT_FROM_DFLASH": "/w", "SHARDS": "2", "ONLY_SHARD": "1"},
    {"STYLES": "dspark dflash", "PHASES": "none", "INIT_FROM": "/a", "INIT_FROM_DFLASH": "/b"},
])
def test_the_ablation_settings_are_accepted(tmp_path, env):
    done = session(tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
