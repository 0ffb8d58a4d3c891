"""The folder of each job of a Hydra sweep: its number, then what the sweep varies in it.

``hydra.sweep.subdir: ${hydra.job.num}_${sweep_job_name:}`` names a job of
``python -m runners.ab -m +workload=agentic,arena_hard load.concurrency=4,16 ab.n_blocks=8``
``0_agentic,concurrency=4``, ``1_agentic,concurrency=16``, ``2_arena_hard,concurrency=4``, ...:

- only the overrides the sweep varies (``a,b``, ``range(...)``, ``choice(...)`` of several values on the command
  line or in ``hydra.sweeper.params``, read from the sweep's ``multirun.yaml``); the overrides every job shares
  are in that file. When the sweep varies nothing (or its record cannot be read), every override of
  the job;
- a config group's choice as the option alone (``agentic``), a key as ``name=value`` with the shortest
  dotted ending that tells the job's keys apart (``concurrency=4``; ``A.engine.verify=full`` next to
  ``B.engine.verify=ragged``);
- keys in ``hydra.job.config.override_dirname.exclude_keys`` (Hydra's own list of keys that do not
  name a job, e.g. ``progress``) left out;
- one folder inside the sweep: path separators and ``..`` become ``_``, and a name longer than
  :data:`NAME_LIMIT` characters is cut and given a short hash of the whole.

The job number keeps two jobs of one sweep apart whatever their names; the same command names its
jobs the same way again, so a rerun of a sweep in the same ``hydra.sweep.dir`` finds its finished jobs.

The sweep summary names each job the same way: an A/B job records its name (:func:`hydra_job_name`) in
its ``summary.json`` as ``sweep_job``, and a summary without one is named from its recorded overrides,
those that differ between the summarized jobs (:func:`varying_keys`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

NAME_LIMIT = 80  # characters of a job folder's name after its number


def safe_dirname(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` as one folder name: characters other than letters, digits and ``=,._+-`` (path separators
    among them) and ``..`` become ``_``; over ``limit`` characters it is cut and given a short hash of
    the whole, so two names never end up the same."""
    out = re.sub(r"[^A-Za-z0-9=,._+-]", "_", name).replace("..", "_")
    if len(out) > limit:
        out = out[: limit - 9] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return out or "job"


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest ending (whole parts) that no other of ``keys`` ends with."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(other != key and (other == tail or other.endswith("." + tail)) for other in keys):
                break
        out[key] = tail
    return out


def job_name(job_overrides: Iterable[str], swept: set[str] | None = None, groups: Iterable[str] = (),
             exclude: Iterable[str] = (), limit: int = NAME_LIMIT) -> str:
    """A sweep job's folder name (after its number) from its overrides: those whose key is in ``swept``
    (all of them when ``swept`` is empty or None), ``exclude`` left out; a key in ``groups`` (a config
    group) as its option alone, any other as ``key=value`` with its shortest distinct ending."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    excluded = set(exclude)
    parsed = [o for o in OverridesParser.create().parse_overrides(list(job_overrides))
              if o.key_or_group not in excluded and not o.is_hydra_override()]
    chosen = [o for o in parsed if swept and o.key_or_group in swept] or parsed
    group_names = set(groups)
    short = _short_keys([o.key_or_group for o in chosen if o.key_or_group not in group_names])
    parts = []
    for o in chosen:
        if o.is_delete():
            parts.append(f"~{short.get(o.key_or_group, o.key_or_group)}")
        elif o.key_or_group in group_names:
            parts.append(o.get_value_element_as_str())
        else:
            parts.append(f"{short[o.key_or_group]}={o.get_value_element_as_str()}")
    return safe_dirname(",".join(parts), limit)


def swept_keys(sweep_overrides: Iterable[str], sweeper_params: Mapping[str, str] | None = None) -> set[str]:
    """The keys (and groups) a sweep varies: its overrides with several values, and ``hydra.sweeper.params``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [*sweep_overrides, *(f"{k}={v}" for k, v in (sweeper_params or {}).items())]
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(lines)
            if o.is_sweep_override() and _values(o) != 1}


def _values(override) -> int | None:
    """How many values a sweep override takes (None where it cannot be listed): ``choice(2)``, the one-value sweep
    that sets a key of a swept group, takes one and names no job."""
    try:
        return len(list(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001  (a sweep Hydra cannot list here: it names the job)
        return None


def _recorded_sweep(sweep_dir: Path) -> set[str] | None:
    """The keys the sweep in ``sweep_dir`` varies, from the multirun.yaml Hydra's sweeper writes there
    before it launches a job; None when there is none to read."""
    try:
        recorded = OmegaConf.load(sweep_dir / "multirun.yaml")
        overrides = OmegaConf.to_container(recorded.hydra.overrides.task)
        params = recorded.hydra.get("sweeper", {}).get("params") or {}
        return swept_keys(overrides, OmegaConf.to_container(params) if params else None)
    except Exception:  # noqa: BLE001  (no record, or another sweeper's: every override names the job)
        return None


def varying_keys(overrides_by_job: Sequence[Iterable[str]]) -> set[str]:
    """The keys (and groups) whose overrides differ between the jobs: set to different values, or set in
    some of the jobs only."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    values = [{o.key_or_group: o.get_value_element_as_str() if not o.is_delete() else None
               for o in parser.parse_overrides(list(job))} for job in overrides_by_job]
    keys = {key for job in values for key in job}
    unset = object()
    return {key for key in keys if len({job.get(key, unset) for job in values}) > 1}


def hydra_job_name(h: DictConfig) -> str:
    """The name ``hydra.sweep.subdir`` gives a job after its number, from the job's ``hydra`` config ``h`` (its
    overrides, the record of its sweep in ``hydra.sweep.dir``, its config groups and ``exclude_keys``)."""
    exclude = h.job.config.override_dirname.get("exclude_keys") or []
    return job_name(OmegaConf.to_container(h.overrides.task), swept=_recorded_sweep(Path(str(h.sweep.dir))),
                    groups=list(h.runtime.choices.keys()), exclude=list(exclude))


def _sweep_job_name_resolver(*, _root_: DictConfig) -> str:
    return hydra_job_name(_root_.hydra)


if not OmegaConf.has_resolver("sweep_job_name"):
    OmegaConf.register_new_resolver("sweep_job_name", _sweep_job_name_resolver)
