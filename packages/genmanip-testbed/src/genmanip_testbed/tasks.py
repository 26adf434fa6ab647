"""The testbed's task catalogue and the config-path rule of the real server.

Benchmark id ``testbed``. Task names are shaped like EBench's: ``testbed/<suite>/<colour>_block_<split>``.
Config paths follow the real rule (the first path component is the benchmark id); the testbed knows:

* ``testbed/all`` (= ``testbed``): the default task set, every suite and split;
* ``testbed/<suite>`` and ``testbed/<suite>/<split>``: a suite, or one split of it;
* ``testbed/<suite>/<task>``: a single task (like a ``.yml`` config); a trailing ``.yml`` is accepted;
* ``testbed/smoke``: one task, two short episodes.

Anything else fails like the real server: ``ValueError: Config file <name> not found``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BENCHMARK_ID",
    "CONFIG_NAMES",
    "DEFAULT_CONFIG",
    "TaskSpec",
    "all_tasks",
    "resolve_configs",
]

BENCHMARK_ID = "testbed"
DEFAULT_CONFIG = "testbed/all"


@dataclass(frozen=True)
class TaskSpec:
    """One task: a goal family, a target colour, a difficulty split.

    Attributes:
        name: the task name as it appears in paths, metrics and episode ids.
        suite: ``"reach"`` (reach the block, close the gripper: 2 stages) or ``"lift"`` (reach, grasp,
            lift: 3 stages).
        colour: the target block's colour name (appears in the instruction).
        split: ``"easy"`` or ``"hard"`` (hard: a similar-coloured distractor near the target, targets
            farther away, fewer steps).
        num_test: seeds per task (``"000"`` .. ``f"{num_test-1:03d}"``).
        num_steps: episode step limit.
    """

    name: str
    suite: str
    colour: str
    split: str
    num_test: int
    num_steps: int

    @property
    def n_stages(self) -> int:
        return 2 if self.suite == "reach" else 3

    def seeds(self) -> list[str]:
        return [f"{i:03d}" for i in range(self.num_test)]


_SUITE_STEPS = {
    ("reach", "easy"): 60,
    ("reach", "hard"): 45,
    ("lift", "easy"): 100,
    ("lift", "hard"): 80,
}
_COLOURS = {
    ("reach", "easy"): ("red", "blue"),
    ("reach", "hard"): ("green", "yellow"),
    ("lift", "easy"): ("blue", "green"),
    ("lift", "hard"): ("red", "yellow"),
}


def _build() -> dict[str, TaskSpec]:
    out: dict[str, TaskSpec] = {}
    for (suite, split), colours in _COLOURS.items():
        for colour in colours:
            name = f"{BENCHMARK_ID}/{suite}/{colour}_block_{split}"
            out[name] = TaskSpec(name, suite, colour, split, 4, _SUITE_STEPS[(suite, split)])
    smoke = TaskSpec(f"{BENCHMARK_ID}/smoke/red_block_easy", "reach", "red", "easy", 2, 40)
    out[smoke.name] = smoke
    return out


_TASKS = _build()


def all_tasks() -> list[TaskSpec]:
    """Every task the testbed knows (the default set plus the smoke task)."""
    return list(_TASKS.values())


def _sets() -> dict[str, list[str]]:
    sets: dict[str, list[str]] = {}
    default = [n for n in _TASKS if "/smoke/" not in n]
    sets[DEFAULT_CONFIG] = default
    sets[BENCHMARK_ID] = default
    sets[f"{BENCHMARK_ID}/smoke"] = [f"{BENCHMARK_ID}/smoke/red_block_easy"]
    for suite in ("reach", "lift"):
        sets[f"{BENCHMARK_ID}/{suite}"] = [n for n in default if n.split("/")[1] == suite]
        for split in ("easy", "hard"):
            sets[f"{BENCHMARK_ID}/{suite}/{split}"] = [
                n for n in default if n.split("/")[1] == suite and n.endswith("_" + split)
            ]
    for name in _TASKS:
        sets[name] = [name]
    return sets


_SETS = _sets()
#: Every config name ``/start_new_job`` and ``--tasks`` accept.
CONFIG_NAMES: tuple[str, ...] = tuple(_SETS)


def resolve_configs(config_paths: list[str]) -> tuple[str, list[TaskSpec]]:
    """Resolve config paths to ``(benchmark_id, tasks)`` like the real server.

    Raises:
        ValueError: ``Config file <name> not found`` for an unknown name (the real server's text).
        AssertionError: ``Only one benchmark is allowed at a time: a vs b``.
    """
    benchmark: str | None = None
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for raw in config_paths:
        name = str(raw).strip()
        key = name[:-4] if name.endswith(".yml") else name
        key = key.strip("/")
        names = _SETS.get(key)
        if names is None:
            raise ValueError(f"Config file {name} not found")
        bench = key.split("/")[0]
        if benchmark is None:
            benchmark = bench
        else:
            assert benchmark == bench, (
                f"Only one benchmark is allowed at a time: {benchmark} vs {bench}"
            )
        for n in names:
            if n not in seen:
                seen.add(n)
                tasks.append(_TASKS[n])
    if benchmark is None:
        raise ValueError("Benchmark ID is not set")
    return benchmark, tasks
