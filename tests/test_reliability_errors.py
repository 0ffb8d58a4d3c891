"""A full or unwritable W&B folder: one clear warning, W&B stops for the rest of the run, the summary says so.

(The other "unclear error" faults of issue 20 are tested next to their code: test_workloads.py,
test_generate_runner.py, test_loading.py, test_drafter.py, test_cost_table.py, test_profiler.py.)
"""

from __future__ import annotations

import errno
import logging
import warnings

from dspark.bench.wandb_log import WandbLogger

LOGGER = "dspark.bench.wandb_log"


class FakeRun:
    """A W&B run whose folder is full: every log raises ENOSPC, as wandb does when it cannot write."""

    def __init__(self, calls: list, folder):
        self.calls, self.dir, self.summary = calls, str(folder / "run" / "files"), {}

    def log(self, row, step=None):
        self.calls.append(("log", step))
        raise OSError(errno.ENOSPC, "No space left on device")

    def finish(self, exit_code=None, quiet=None):
        self.calls.append(("finish", exit_code, quiet))


class FakeWandb:
    def __init__(self, folder):
        self.calls: list = []
        self.folder = folder

    def init(self, **kwargs):
        self.calls.append(("init", kwargs["name"]))
        return FakeRun(self.calls, self.folder)

    def Table(self, dataframe):  # noqa: N802 (wandb's name)
        return dataframe

    def teardown(self):
        self.calls.append(("teardown",))


def wandb_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_full_wandb_folder_warns_once(tmp_path, caplog):
    folder = tmp_path / "wandb"
    logger = WandbLogger(mode="offline", project="p", dir=tmp_path)
    fake = logger._wandb = FakeWandb(folder)
    with caplog.at_level(logging.WARNING, logger=LOGGER), warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning per call either
        for arm in ("A", "B"):
            logger.start_arm(arm, config={})
        for block in range(350):  # an A/B run's worth of blocks: one line in all, not one per call
            for arm in ("A", "B"):
                logger.log_block(arm, block, {"output_tokens_per_s": 1.0})
        for arm in ("A", "B"):
            logger.log_requests(arm, [])
            logger.finish_arm(arm, {"verdict": "faster"})
        logger.close()
    (message,) = wandb_warnings(caplog)
    assert "W&B logging stopped for the rest of this run: log_block for arm A failed" in message
    assert f"on the W&B folder {folder}" in message and "No space left on device" in message
    assert "own files (blocks.csv, summary.json, requests.parquet) are unaffected" in message
    # The first failure stopped W&B: no further log call, both runs closed quietly once, W&B shut down.
    assert [c for c in fake.calls if c[0] == "log"] == [("log", 0)]
    assert [c for c in fake.calls if c[0] == "finish"] == [("finish", 1, True)] * 2
    assert fake.calls[-1] == ("teardown",)
    status = logger.status()
    assert status["stopped"]["call"] == "log_block" and status["stopped"]["arm"] == "A"
    assert status["stopped"]["folder"] == str(folder) and "No space left on device" in status["stopped"]["error"]
    assert status["stopped"]["message"].startswith("W&B logging stopped at log_block for arm A")
    assert [f["call"] for f in status["failures"]] == ["log_block"]


def test_wandb_log_file_failure_stops_without_a_flood(tmp_path, caplog, capsys, monkeypatch):
    """W&B's own debug.log handler on a full disk: each failed write printed a '--- Logging error ---'
    traceback, which W&B's console capture fed back into the same handler (~700 per run)."""
    folder = tmp_path / "wandb"
    logger = WandbLogger(mode="offline", project="p", dir=tmp_path)
    wandb_logger = logging.getLogger("wandb")
    monkeypatch.setattr(wandb_logger, "handlers", [])  # restored after the test

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = write

    (folder / "run" / "logs").mkdir(parents=True)
    handler = logging.FileHandler(folder / "run" / "logs" / "debug.log", delay=True)
    handler.stream = FullDisk()
    wandb_logger.addHandler(handler)
    logger._watch_log_files()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for i in range(100):
            wandb_logger.warning("wandb internal message %d", i)
    assert "--- Logging error ---" not in capsys.readouterr().err
    (message,) = wandb_warnings(caplog)
    assert "W&B's log file debug.log failed on the W&B folder" in message and "No space left" in message
    assert handler not in wandb_logger.handlers  # detached: W&B cannot write there anymore
    assert logger.status()["stopped"]["call"] == "W&B's log file debug.log"


def test_unwritable_wandb_folder_stops_before_start(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        logger = WandbLogger(mode="offline", project="p", dir=blocker)  # no raise
    fake = logger._wandb = FakeWandb(tmp_path)
    logger.start_arm("A", config={})
    logger.log_block("A", 0, {"x": 1.0})
    logger.finish_arm("A", {})
    logger.close()
    assert [c[0] for c in fake.calls] == ["teardown"]  # no run was ever started
    (message,) = wandb_warnings(caplog)
    assert "the folder check failed on the W&B folder" in message and "Not a directory" in message
    assert logger.status()["stopped"]["call"] == "the folder check"


def test_disabled_wandb_touches_no_folder(tmp_path):
    logger = WandbLogger(mode="disabled", dir=tmp_path / "a" / "b")
    logger.start_arm("A", {})
    assert logger.status()["stopped"] is None and not (tmp_path / "a").exists()
