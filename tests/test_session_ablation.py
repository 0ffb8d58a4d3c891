"""bench/h200_session.sh, the DFlash ablation continued beside a shipped DSpark: its settings (STYLES=dflash alone,
INIT_FROM_DFLASH, ABLATE_FROM_INIT, SHARDS / ONLY_SHARD, PARTS) are refused with a reason before anything runs when
they cannot make the ablation's data or steps, and the accepted ones reach no phase (PHASES=none) without an
error."""

from __future__ import annotations

import pytest

from session_script import data_folder, run_session as session


@pytest.mark.parametrize("env, code, message", [
    ({"STYLES": "dspark dflash", "INIT_FROM": "builtin:dspark-smollm2"}, 2, "continue the ablation from its own"),
    ({"STYLES": "dspark", "INIT_FROM_DFLASH": "/w"}, 2, "trains no DFlash ablation"),
    ({"STYLES": "dflash", "MARKOV_VARIANT": "rnn"}, 2, "STYLES=dflash trains no DSpark"),
    ({"STYLES": "dflash", "PHASES": "data train finish"}, 2, "the finish phase ships DSpark"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "0"}, 2, "SHARDS=0: a whole number >= 1"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "2", "ONLY_SHARD": "2"}, 2, "from 0 to SHARDS-1 (1)"),
    ({"STYLES": "dflash", "PHASES": "data", "SHARDS": "2", "ONLY_SHARD": "x"}, 2, "ONLY_SHARD=x"),
    ({"STYLES": "dflash", "PHASES": "data", "PARTS": "0"}, 2, "PARTS=0: a whole number >= 1"),
    ({"STYLES": "dflash", "PHASES": "data", "PARTS": "two"}, 2, "PARTS=two: a whole number >= 1"),
    ({"STYLES": "dspark", "INIT_FROM": "/a", "ABLATE_FROM_INIT": "1"}, 2, "it needs STYLES=\"dspark dflash\""),
    ({"STYLES": "dspark dflash", "ABLATE_FROM_INIT": "1"}, 2, "ABLATE_FROM_INIT=1 starts both styles"),
    ({"STYLES": "dspark dflash", "INIT_FROM": "/a", "ABLATE_FROM_INIT": "1", "GROW_LAYERS": "3"}, 2,
     "neither INIT_FROM_DFLASH, GROW_LAYERS nor MARKOV_RANK"),
    ({"STYLES": "dspark dflash", "INIT_FROM": "/a", "INIT_FROM_DFLASH": "/b", "ABLATE_FROM_INIT": "1"}, 2,
     "neither INIT_FROM_DFLASH"),
])
def test_settings_that_cannot_make_the_ablation_are_refused_first(tmp_path, env, code, message):
    refused = session(tmp_path, **env)
    assert refused.returncode == code and message in refused.stdout, refused.stdout + refused.stderr
    assert not (tmp_path / "work" / "site").exists()  # refused before the model was staged


@pytest.mark.parametrize("env", [
    {"STYLES": "dflash", "PHASES": "none", "INIT_FROM_DFLASH": "/w", "SHARDS": "2", "ONLY_SHARD": "1"},
    {"STYLES": "dspark dflash", "PHASES": "none", "INIT_FROM": "/a", "INIT_FROM_DFLASH": "/b"},
    {"STYLES": "dspark dflash", "PHASES": "none", "INIT_FROM": "/a", "ABLATE_FROM_INIT": "1"},
])
def test_the_ablation_settings_are_accepted(tmp_path, env):
    done = session(tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr


def fake_data(tmp_path, *tags: str) -> None:
    data_folder(tmp_path / "work" / "data", {}, bare=tags)


def test_a_train_call_without_the_data_calls_parts_is_refused_with_the_files_it_found(tmp_path):
    """Data made with PARTS=2 is train_0p0 and train_0p1: a train call that leaves PARTS out names train_0, which
    is not there, and is refused before any training starts, with the files that are."""
    fake_data(tmp_path, "0p0", "0p1")
    refused = session(tmp_path, STYLES="dflash", PHASES="train")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "TRAIN: no train_0.safetensors" in refused.stdout and "./train_0p0.safetensors" in refused.stdout
    assert "PARTS=1" in refused.stdout and not (tmp_path / "work" / "train_dflash.log").exists()


def test_a_training_run_that_fails_fails_the_call_and_returns_no_weights(tmp_path):
    """The training process's error is the call's: it exits non-zero and RETURN_WEIGHTS sends nothing back (the
    run has no weights of this call's)."""
    fake_data(tmp_path, "0p0", "0p1")
    failed = session(tmp_path, STYLES="dflash", PHASES="train", PARTS="2", RETURN_WEIGHTS="dflash")
    assert failed.returncode == 8 and "TRAINING FAILED: dflash" in failed.stdout, failed.stdout + failed.stderr
    assert (tmp_path / "work" / "train_dflash.log").exists()  # it did start
    assert not list((tmp_path / "out").glob("final_dflash*"))


def test_a_data_call_that_makes_no_file_fails(tmp_path):
    """A data process that fails, on captured steps and again eagerly (here: the stage's model file is not a
    model), fails the call, naming the file it did not make, rather than ending as if the data were there."""
    failed = session(tmp_path, STYLES="dflash", PHASES="data", PARTS="2", ONLY_SHARD="0", SHARDS="2")
    assert failed.returncode == 7, failed.stdout + failed.stderr
    assert "DATA FAILED: no train_0p0 train_0p1 after the eager retry" in failed.stdout
    assert not list((tmp_path / "work").glob("data_1*.log"))  # shard 1 is another call's
