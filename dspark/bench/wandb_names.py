"""What the W&B runs of one A/B job are called: the group, each arm's run name, job type and label, the tags.

One A/B job (one output folder) is one W&B group holding one run per arm. The group names the
experiment and the job: ``<experiment>/<run folder>`` for a single run and
``<experiment>/<sweep folder>/job<N>`` for job N of a Hydra multirun, so no two jobs or sweeps share
a group. A run's name says its arm, what the arm runs and the job, e.g.
``B ragged (verify=uniform) [job3]``.

An arm's label is its configured label (``ab.arms.<arm>.label``) followed by the engine settings in
which the two arms differ, taken from the engine configurations the arms run: a configured label
that an override made wrong (``ragged`` on an arm running ``verify=uniform``) shows next to the
setting that contradicts it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

MAX_NAME_CHARS = 128  # W&B's limit on group and run names
MAX_TAG_CHARS = 64  # W&B's limit on tags and job types
# Engine settings left out of labels: the runner attaches a cost-table file to the arms that plan
# with one, a consequence of the arm's verify mode (already in the label), not a choice of its own.
UNLABELLED_SETTINGS = ("cost_table",)
MAX_SETTINGS_IN_LABEL = 3
RESULTS_ARTIFACT_TYPE = "ab-results"


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _setting_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _settings(engine: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``engine``'s settings by dotted name (``kernels.fused_layers``): the keys a label can name."""
    out: dict[str, Any] = {}
    for key, value in engine.items():
        if isinstance(value, Mapping):
            out |= _settings(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def engine_differences(engines: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per arm, the engine settings in which the arms differ, as ``key=value`` (in the engine's key order)."""
    settings = {arm: _settings(engine) for arm, engine in engines.items()}
    keys = list(dict.fromkeys(k for s in settings.values() for k in s))
    differing = [k for k in keys if k not in UNLABELLED_SETTINGS
                 and len({_setting_value(s.get(k)) for s in settings.values()}) > 1]
    return {arm: [f"{k}={_setting_value(s.get(k))}" for k in differing] for arm, s in settings.items()}


def arm_label(configured: str, differences: list[str]) -> str:
    """``configured`` followed by the settings that set the arm apart: ``ragged (verify=uniform)``."""
    if not differences:
        return f"{configured} (same engine settings as the other arm)"
    shown = differences[:MAX_SETTINGS_IN_LABEL]
    more = len(differences) - len(shown)
    return f"{configured} ({', '.join(shown)}{f', +{more} more' if more else ''})"


def results_artifact_name(group: str) -> str:
    """The name of the artifact holding a job's result files (W&B allows letters, digits, ``-``, ``_``, ``.``)."""
    return f"ab-results-{re.sub(r'[^A-Za-z0-9_.-]+', '-', group).strip('-')}"[:MAX_NAME_CHARS]


@dataclass(frozen=True)
class ABRunNames:
    """The names of one A/B job's W&B runs (see the module docstring)."""

    experiment: str
    job: str  # "job<N>" in a multirun, else the run folder's name
    sweep: str | None = None  # the sweep folder's name in a multirun
    labels: Mapping[str, str] = field(default_factory=dict)  # arm -> label

    @property
    def group(self) -> str:
        parts = [self.experiment, self.sweep, self.job] if self.sweep else [self.experiment, self.job]
        return _capped("/".join(parts), MAX_NAME_CHARS)

    def label(self, arm: str) -> str:
        return self.labels.get(arm, arm)

    def run_name(self, arm: str) -> str:
        suffix = f" [{self.job}]"
        return _capped(f"{arm} {self.label(arm)}", MAX_NAME_CHARS - len(suffix)) + suffix

    def job_type(self, arm: str) -> str:
        return _capped(f"{arm} {self.label(arm)}", MAX_TAG_CHARS)

    def tags(self, extra: Iterable[str] = ()) -> list[str]:
        """``extra`` (wandb.tags), the experiment and, in a multirun, ``sweep:<sweep folder>``."""
        tags = [*extra, self.experiment, *([f"sweep:{self.sweep}"] if self.sweep else [])]
        return list(dict.fromkeys(_capped(str(t), MAX_TAG_CHARS) for t in tags))

    def run_config(self, arm: str) -> dict[str, Any]:
        """What a run's config records about its place in the experiment."""
        return {"arm": arm, "arm_label": self.label(arm), "job": self.job, "sweep": self.sweep}

    @property
    def results_artifact(self) -> str:
        return results_artifact_name(self.group)


def ab_run_names(experiment: str, out_dir: str | Path, arms: Mapping[str, tuple[str, Mapping[str, Any]]],
                 sweep_dir: str | Path | None = None, job_num: int | None = None) -> ABRunNames:
    """The names of an A/B job's runs. ``arms``: arm -> (configured label, the engine configuration it
    runs, as a dict); ``sweep_dir`` and ``job_num``: Hydra's ``hydra.sweep.dir`` and ``hydra.job.num``
    when the job is part of a multirun, else None (the job is then named after ``out_dir``)."""
    differences = engine_differences({arm: engine for arm, (_, engine) in arms.items()})
    labels = {arm: arm_label(configured, differences[arm]) for arm, (configured, _) in arms.items()}
    if sweep_dir is not None and job_num is not None:
        return ABRunNames(experiment, f"job{job_num}", Path(sweep_dir).name, labels)
    return ABRunNames(experiment, Path(out_dir).resolve().name, None, labels)
