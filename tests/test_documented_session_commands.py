"""The GPU session commands the model card gives (retraining each stage, the DFlash ablation through the later
stages) set only settings their script reads: a misspelt knob (say INIT_FROM_DFLSH) would otherwise be ignored by
bash and the run would quietly train something else, or from scratch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CARD = REPO / "dspark" / "assets" / "dspark-smollm2" / "MODEL_CARD.md"
SCRIPTS = ("h200_session.sh", "h200_heldout_eval.sh", "h200_calibration.sh")
# Read by the environment rather than by the script's own text: CUDA's device list.
ENVIRONMENT = {"CUDA_VISIBLE_DEVICES"}
# bench/h200_session.sh's sources when SOURCES is not set (on a GPU)
SESSION_SOURCES = "[agentic,poetry,arena_hard,stdlib_prose,hard_questions,tool_calls,chat_followups]"


def bash_commands(markdown: str) -> list[str]:
    """The commands of every ```bash block: continuation lines and quoted values that span lines joined, comments
    dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        pending = ""
        for line in block.splitlines():
            if not pending:
                line = re.sub(r"^\s*#.*$", "", line)
            pending = f"{pending} {line.strip()}" if pending else line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1]
            elif pending.count('"') % 2 == 0:
                commands.append(re.sub(r"\s+#[^\"']*$", "", pending).strip())
                pending = ""
    return [c for c in commands if c]


def assignments(command: str) -> dict[str, str]:
    """The VAR=value settings in front of a command, or the whole line when it only sets shell variables; quotes
    are taken off the values (which may hold spaces and braces)."""
    found = {}
    rest = command + " "
    while True:
        m = re.match(r"""([A-Z][A-Z0-9_]*)=("[^"]*"|'[^']*'|\S*)\s+""", rest)
        if not m:
            return found
        found[m.group(1)] = m.group(2).strip("\"'")
        rest = rest[m.end():]


def settings(command: str) -> list[str]:
    """The names of the VAR=value settings in front of a command."""
    return list(assignments(command))


def script_reads(script: str) -> set[str]:
    text = (REPO / "bench" / script).read_text()
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", text))


def documented_runs() -> list[tuple[str, str, list[str]]]:
    runs = []
    for command in bash_commands(CARD.read_text()):
        for script in SCRIPTS:
            if f"bench/{script}" in command:
                runs.append((script, command, settings(command)))
    return runs


def test_the_card_documents_runs_of_each_script():
    used = {script for script, _, _ in documented_runs()}
    assert used == set(SCRIPTS), used
    ablation = [c for s, c, _ in documented_runs() if "STYLES=dflash" in c]
    assert len(ablation) >= 10 and any("DFLASH3" in c for c in ablation)  # stages 1-5 of the ablation


@pytest.mark.parametrize("script, command, names", documented_runs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_setting_is_one_the_script_reads(script, command, names):
    assert names, f"no settings parsed from: {command}"
    unknown = [n for n in names if n not in script_reads(script) | ENVIRONMENT]
    assert not unknown, f"{script} never reads {unknown}: {command}"


def test_the_parser_sees_a_misspelt_setting():
    (_, command, names), = [r for r in documented_runs() if "INIT_FROM_DFLASH=DFLASH3" in r[1]]
    bad = command.replace("INIT_FROM_DFLASH=", "INIT_FROM_DFLSH=")
    assert "INIT_FROM_DFLSH" in settings(bad) and "INIT_FROM_DFLSH" not in script_reads("h200_session.sh")
    assert settings('A="{x: 1, y: 2}" B=[p,q] C=3 bash s.sh') == ["A", "B", "C"]


def ablation_data_runs() -> list[dict[str, str]]:
    """The settings of each data run of the DFlash ablation's commands, shell variables ($S4, $SRC45) expanded."""
    shell: dict[str, str] = {}
    runs = []
    for command in bash_commands(CARD.read_text()):
        found = assignments(command)
        if found and "bench/" not in command:  # S4="{...}" and the like
            shell.update(found)
            continue
        if "bench/h200_session.sh" in command and found.get("STYLES") == "dflash" and "data" in found["PHASES"]:
            runs.append({k: re.sub(r"\$(\w+)", lambda m: shell[m.group(1)], v) for k, v in found.items()})
    return runs


def test_the_ablation_makes_each_stage_data_again_from_the_shipped_record():
    """Each later stage's data run of the ablation asks for the recipe the shipped record holds for DSpark's: its
    sources, samples per prompt, prompts per source, seed, greedy-first and admitted requests."""
    from runners import make_training_data as mtd

    lineage = mtd.load_prompt_record("builtin:dspark-smollm2")["recipe"]["lineage"]
    assert len(lineage) == 12  # from scratch, A to E, G, H, I, J, M, N
    later = []
    for entry in lineage[2:6]:  # B, C, D, E (A's recipe is B's: the same order, more of it admitted)
        (shard,) = entry["recipe"]["shards"]
        later.append(shard)
    runs = [r for r in ablation_data_runs() if "MAX_REQUESTS" in r]
    by_admitted = {int(r["MAX_REQUESTS"]): r for r in runs}
    assert int(lineage[1]["shards"][0]["admitted"]) in by_admitted  # data A
    for shard in later:
        admitted = shard["shards"][0]["admitted"]
        run = by_admitted.get(admitted)
        assert run is not None, f"no ablation data run answers the {admitted} requests DSpark's data admitted"
        assert yaml.safe_load(run["SAMPLES"]) == shard["samples_per_prompt"]
        assert yaml.safe_load(run.get("SOURCES", SESSION_SOURCES)) == shard["sources"]
        assert yaml.safe_load(run.get("PER_SOURCE", "null")) == shard["num_prompts_per_source"]
        seed = re.search(r"seed=(\d+)", run.get("DATA_ARGS", ""))
        assert (int(seed.group(1)) if seed else 0) == shard["seed"]
    greedy = {e["recipe"]["shards"][0]["shards"][0]["admitted"] for e in lineage[3:6]}  # C, D, E: greedy first
    assert {int(r["MAX_REQUESTS"]) for r in runs if r.get("GREEDY_FIRST") == "true"} == greedy
    # G, stage 6: its data is made once and both drafters train on it in one call, from their own stage-5 weights
    calls = [assignments(c) for c in bash_commands(CARD.read_text()) if "bench/h200_session.sh" in c]
    assert any(c.get("PHASES") == "train" and c.get("STYLES") == "dspark dflash" and c.get("INIT_FROM_DFLASH")
               and c.get("INIT_FROM") for c in calls)


def test_each_ablation_train_call_names_the_data_its_work_folder_holds():
    """A train call finds its data by SHARDS and PARTS (train_0, or train_0p0 and train_0p1, ...): one that follows a
    data call in the same WORK must set them as that call did, or bench/h200_session.sh refuses it (it did once, in
    a call that left PARTS=2 out). Data unpacked from carried parts (RESTORE) is trusted to the command's own
    setting."""
    shell: dict[str, str] = {}
    made: dict[str, tuple[str, str]] = {}  # WORK -> (SHARDS, PARTS) of the last data call there
    checked = 0
    for command in bash_commands(CARD.read_text()):
        found = assignments(command)
        if found and "bench/" not in command:
            shell.update(found)
            continue
        if "bench/h200_session.sh" not in command or found.get("STYLES") != "dflash":
            continue
        found = {k: re.sub(r"\$(\w+)", lambda m: shell.get(m.group(1), m.group(0)), v) for k, v in found.items()}
        work, phases = found.get("WORK", "/tmp/dspark-session"), found["PHASES"].split()
        layout = (found.get("SHARDS", "1"), found.get("PARTS", "1"))
        if "data" in phases:
            made[work] = layout
        elif "train" in phases and work in made and "RESTORE" not in found:
            assert layout == made[work], f"SHARDS/PARTS {layout} after data made as {made[work]}: {command}"
            checked += 1
    assert checked >= 3, checked  # stage 1's second train call, stage 4's and stage 5's resumed one
