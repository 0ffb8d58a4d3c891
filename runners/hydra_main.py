"""The runners' Hydra entry point: ``@runner_main("ab")`` is ``@hydra.main(version_base="1.3",
config_path="../conf", config_name="ab")`` whose composition errors say what to type instead.

A key the typed schema does not declare (``ab.n_block=4``) fails at composition, as Hydra does it;
the error then names the closest keys the schema declares (``Did you mean ab.n_blocks?``) instead of
Hydra's advice to append the key with ``+``. An override under a null node (a config group that was not
chosen, ``workload.num_prompts=4`` without ``+workload=NAME``, or a section the chosen config leaves null, such as
an arm's ``http`` in an in-process A/B) says so instead of failing with a traceback.

An error that names the setting or input to change (:func:`reported_errors`: a ConfigError, unusable training
data, a missing file, a cost table that does not fit, a profile the engine cannot run or a busy machine refused,
failed guards) is printed as its message alone, exit status 1,
without the traceback Hydra would print; a Ctrl-C before a runner handles it ends with "interrupted", status 130.

Hydra reports a composition error itself (``hydra._internal.utils.run_and_report``, which prints it
and exits 1) before the decorated function could catch it, so while the runner's main runs, that
reporter is given the error with its message completed. Importing this module also registers the
resolvers the runners' configs use: ``config_keys`` (``--help``, :mod:`runners.config_keys`) and
``sweep_job_name`` (a sweep job's folder, :mod:`runners.sweep_dirs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
from typing import Any, Callable, Iterator

import hydra
from hydra.errors import CompactHydraException, ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

import runners.config_keys  # noqa: F401  (registers the config_keys resolver of --help)
import runners.sweep_dirs  # noqa: F401  (registers the sweep_job_name resolver of hydra.sweep.subdir)
from dspark.config import ConfigError
from runners.config_keys import allowed_keys, close_keys, refuse_unknown_keys

# What OmegaConf asserts when an override sets a key under a null node (a group that was not chosen, or a
# section the chosen config leaves null).
NULL_PARENT_ASSERTION = "Unexpected type for root: NoneType"
# What OmegaConf raises when an override merges a mapping into such a null section ('ab.arms.A.http={...}').
NULL_SECTION_MERGE = re.compile(r"full_key: (\S+)\n.*object_type=NoneType", re.DOTALL)
NULL_SECTION_HINT = ("a section the chosen config leaves null cannot be set, key by key or as a whole (an arm's `http` "
                     "is set only in `ab=http_full_vs_ragged` and `ab=in_process_vs_served`: choose one of those and "
                     "override its keys, or write an `ab` config of your own)")


class ReportedError(CompactHydraException):
    """An error Hydra's reporter prints as its message alone (no traceback) before exiting 1."""


def reported_errors() -> tuple[type[BaseException], ...]:
    """The errors whose message says what to change: a setting or an input (ConfigError, WorkloadError and
    DamagedFileError among them; training data that cannot be used; a file a setting names that is not there), a
    cost table that does not fit the engine, profile settings the engine cannot run or a profile refused on a
    machine busy with other work, failed guards (the run's results are written first)."""
    from dspark.bench.guards import ABGuardError
    from dspark.cost_table import CostTableError
    from dspark.profiler import ProfileError
    from dspark.training.data import DataError

    return ConfigError, DataError, FileNotFoundError, CostTableError, ProfileError, ABGuardError


class UnknownConfigKeyError(ConfigCompositionException, ConfigError):
    """An override names a key the schema does not declare; the message names the closest ones. Hydra
    prints it as a composition error (no traceback)."""


def unknown_key_message(exc: ConfigCompositionException) -> str | None:
    """The message of a composition error caused by an undeclared key, naming the closest declared keys
    (or, when none is close, the keys declared next to it); None for other composition errors."""
    cause = exc.__cause__
    schema = getattr(cause, "object_type", None)
    key = getattr(cause, "full_key", None)
    undeclared = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and dataclasses.is_dataclass(schema)
    if not undeclared or not key:
        return None
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    nearby = allowed_keys(schema, prefix)
    if key in nearby:  # a declared key: another error
        return None
    matches = close_keys(key, schema, prefix)
    if matches:
        return (f"Could not override '{key}': no such key. Did you mean {' or '.join(matches)}? "
                "(--help lists every key)")
    return f"Could not override '{key}': no such key; the keys here are {', '.join(nearby)} (--help lists every key)"


SWEPT_GROUP = re.compile(r"^\+{0,2}(\w+)=[^=]*,")  # +workload=agentic,arena_hard: a group swept over options


def swept_group_hint(args: list[str]) -> str | None:
    """For a multirun that sweeps a config group and also sets keys under it (``-m +workload=a,b
    workload.num_prompts=4``): what to write instead. Hydra composes a multirun's first config without its sweeps,
    so the group is not chosen there and a plain key under it has nowhere to go; a one-value sweep
    (``workload.num_prompts=choice(4)``) is applied in each job, after the job's group option. None otherwise."""
    if not {"-m", "--multirun"} & set(args):
        return None
    groups = {m.group(1) for a in args if (m := SWEPT_GROUP.match(a))}
    keys = [a for a in args if "=" in a and a.lstrip("+~").split(".", 1)[0] in groups and "." in a.split("=", 1)[0]
            and "choice(" not in a]
    if not keys:
        return None
    fixed = " ".join(f"'{k.split('=', 1)[0]}=choice({k.split('=', 1)[1]})'" for k in keys)
    return (f"Could not override {', '.join(k.split('=', 1)[0] for k in keys)}: the sweep varies its group "
            f"({', '.join(sorted(groups))}), and Hydra composes a sweep's first config without its sweeps, where the "
            f"group is not chosen yet. Write each such key as a sweep of one value, which every job applies after "
            f"choosing its option: {fixed}")


def _with_clear_errors(func: Callable[[], Any]) -> Any:
    """``func()`` with its errors answered as the module docstring says: key hints, reported errors, a Ctrl-C."""
    try:
        return func()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (SIGINT)" + os.linesep)
        raise SystemExit(130) from None
    except ConfigCompositionException as exc:
        message = unknown_key_message(exc)
        if message is None:
            raise
        raise UnknownConfigKeyError(message) from exc.__cause__
    except reported_errors() as exc:
        raise ReportedError(f"{type(exc).__name__}: {exc}") from exc
    except AssertionError as exc:
        if str(exc) != NULL_PARENT_ASSERTION:
            raise
        raise ConfigCompositionException(swept_group_hint(sys.argv[1:]) or (
            "Could not override a key under a null value: a config group that was not chosen needs choosing first "
            "(`+workload=NAME` before `workload.*`: `+workload=poetry workload.num_prompts=4`), and "
            f"{NULL_SECTION_HINT}")) from None
    except AttributeError as exc:  # OmegaConf merging a mapping into a null section of a typed schema
        found = NULL_SECTION_MERGE.search(str(exc))  # OmegaConf writes the node into the message, not attributes
        if found is None:
            raise
        key = found.group(1)
        raise ConfigCompositionException(f"Could not set '{key}': {NULL_SECTION_HINT}") from None


@contextlib.contextmanager
def _key_hints_in_hydra_reports() -> Iterator[None]:
    from hydra._internal import utils as hydra_utils

    report = getattr(hydra_utils, "run_and_report", None)
    if report is None:  # another Hydra: its own messages
        yield
        return

    def run_and_report(func: Callable[[], Any]) -> Any:
        return report(lambda: _with_clear_errors(func))

    hydra_utils.run_and_report = run_and_report
    try:
        yield
    finally:
        hydra_utils.run_and_report = report


def runner_main(config_name: str) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """``@hydra.main`` of a runner whose config is ``conf/<config_name>.yaml``, with the key hints above."""

    def decorate(task: Callable[[Any], Any]) -> Callable[..., Any]:
        @functools.wraps(task)
        def checked_task(cfg: Any) -> Any:
            refuse_unknown_keys(cfg)  # +foo=1 or +engine.verfy=full: added even to a typed config
            return task(cfg)

        hydra_main = hydra.main(version_base="1.3", config_path="../conf", config_name=config_name)(checked_task)

        @functools.wraps(task)
        def main(cfg_passthrough: Any = None) -> Any:
            if cfg_passthrough is not None:
                return task(cfg_passthrough)
            with _key_hints_in_hydra_reports():
                return hydra_main()

        return main

    return decorate
