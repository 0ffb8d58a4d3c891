"""bench/h200_session.sh passes a data call's SAMPLES and SOURCES to runners.make_training_data as Hydra overrides."""

from __future__ import annotations

from session_script import run_session


def test_samples_and_sources_written_over_several_lines_reach_the_data_process(tmp_path):
    """The model card writes long SAMPLES over two lines. Hydra's override grammar refuses a line break inside a
    value, which would fail every data process before it started; the script folds them to one line, so the
    process gets as far as reading the model (here a stage file that is not a model, so the call still fails)."""
    failed = run_session(tmp_path, STYLES="dspark", PHASES="data", SOURCES="[poetry,\n  stdlib_prose]",
                         SAMPLES="{poetry: 2,\n           stdlib_prose: 1}")
    assert failed.returncode == 7, failed.stdout + failed.stderr
    log = (tmp_path / "work" / "data_0.log").read_text()
    assert "LexerNoViableAltException" not in log and "override grammar" not in log, log[-2000:]
    assert "not a readable GGUF file" in log, log[-2000:]
