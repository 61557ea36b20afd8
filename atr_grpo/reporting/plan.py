"""The analysis plan of an experiment: what its runs will be tested for, fixed and committed before the first run.

The plan lives beside the experiment's runs, `results/<experiment>/plan.yaml` (the runs in `results/<experiment>/runs`;
`results --plan PATH` names another). It names:

    experiment: power2              # the runs' `experiment`
    seeds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    endpoint: auc                   # final or auc (cells.ENDPOINTS)
    metric: mean@8
    benchmark: arithmetic           # or `average`
    test: seed_sign_flip            # or paired_t (TESTS)
    alpha: 0.05
    equivalence_margin: 0.5         # points: a "no difference" claim needs TOST within ±margin
    primary: [atr, clip]            # A − B
    secondary:                      # may be empty
      - [clip_higher, clip]
    study: lr_sweep                 # optional: the study whose methods these are (the runs' `study`)

Its methods are resolved in one study: the one it names, else the one its experiment's runs belong to. Runs of the
experiment in several studies, with no `study:` to choose, are refused: pairing atr of one study with clip of another
would compare two settings at once.

The family is tested by serial gatekeeping (Westfall & Krishen 2001; Dmitrienko et al. 2003): the primary alone at
α; the secondaries only when the primary rejects, then by Holm among themselves at α. A secondary's adjusted p is
max(p of the primary, its Holm p), so it rejects exactly when the gate is open and Holm rejects it; the family-wise
error stays ≤ α. When the primary does not reject, no secondary is tested, whatever its p.

The plan's commit is the git commit that last changed the file. A run made from a commit that does not descend from
it was made before the plan existed or under an earlier version of it: `runs_against_plan` names such runs.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from atr_grpo import rundir
from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.metric import EXPECTED, Metric
from atr_grpo.reporting.runs import AVERAGE

PLAN_FILE = "plan.yaml"
TESTS = ("seed_sign_flip", "paired_t")
KEYS = (
    "experiment",
    "seeds",
    "endpoint",
    "metric",
    "benchmark",
    "test",
    "alpha",
    "equivalence_margin",
    "primary",
    "secondary",
)
OPTIONAL_KEYS = ("study",)


class PlanError(ValueError):
    """The plan file cannot be read or breaks a rule; the message names the file and the key."""


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str

    @property
    def label(self) -> str:
        return f"{self.a} − {self.b}"


@dataclass(frozen=True)
class Plan:
    path: Path
    experiment: str
    seeds: tuple[int, ...]
    endpoint: str
    metric: str
    benchmark: str
    test: str
    alpha: float
    equivalence_margin: float  # in points
    primary: Comparison
    secondary: tuple[Comparison, ...]
    study: str | None = None  # None: the one study of the experiment's runs

    def level(self, role: str) -> float:
        """The level a comparison's test uses: α for the primary, Holm's first step among the secondaries."""
        return self.alpha if role == PRIMARY else stats.holm_level(self.alpha, len(self.secondary))


PRIMARY, SECONDARY = "primary", "secondary"


def default_path(runs_dir: Path) -> Path:
    """Where the plan of the runs in `runs_dir` lives: beside that folder."""
    return Path(runs_dir).resolve().parent / PLAN_FILE


def load_plan(path: str | Path) -> Plan:
    """The plan in `path`, checked; PlanError names the key and what it allows."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise PlanError(f"{path}:{line}: byte {err.start} is not UTF-8; save the plan as UTF-8") from None
    except (OSError, yaml.YAMLError) as err:
        raise PlanError(f"{path}: cannot read the plan ({err})") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: a plan is a mapping with the keys {', '.join(KEYS)}")
    unknown, missing = sorted(set(raw) - set(KEYS) - set(OPTIONAL_KEYS)), [k for k in KEYS if k not in raw]
    if unknown:
        allowed = ", ".join((*KEYS, *OPTIONAL_KEYS))
        raise PlanError(f"{path}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {allowed}")
    if missing:
        raise PlanError(f"{path}: missing key(s) {', '.join(missing)}")
    experiment = raw["experiment"]
    if not isinstance(experiment, str) or not experiment:
        raise _bad(path, "experiment", experiment, "the runs' experiment name")
    seeds = raw["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(type(s) is int for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise _bad(path, "seeds", seeds, "a non-empty list of distinct integers")
    if raw["endpoint"] not in cells.ENDPOINTS:
        raise _bad(path, "endpoint", raw["endpoint"], " or ".join(cells.ENDPOINTS))
    metric = raw["metric"]
    if not Metric.is_name(metric):
        raise _bad(path, "metric", metric, EXPECTED)
    if not isinstance(raw["benchmark"], str) or not raw["benchmark"]:
        raise _bad(path, "benchmark", raw["benchmark"], f"a benchmark the runs evaluate, or {AVERAGE}")
    if raw["test"] not in TESTS:
        raise _bad(path, "test", raw["test"], " or ".join(TESTS))
    alpha = _number(raw["alpha"])
    if alpha is None or not 0 < alpha < 0.5:
        raise _bad(path, "alpha", raw["alpha"], "a number in (0, 0.5)")
    margin = _number(raw["equivalence_margin"])
    if margin is None or not 0 < margin < math.inf:
        raise _bad(path, "equivalence_margin", raw["equivalence_margin"], "a number of points > 0")
    primary = _comparison(raw["primary"], "primary", path)
    if not isinstance(raw["secondary"], list):
        raise _bad(path, "secondary", raw["secondary"], "a list of [A, B] pairs (may be empty)")
    secondary = tuple(_comparison(item, f"secondary[{i}]", path) for i, item in enumerate(raw["secondary"]))
    study = raw.get("study")
    if study is not None and (not isinstance(study, str) or not study):
        raise _bad(path, "study", study, "the runs' study name (config `study`), or leave the key out")
    every = [primary, *secondary]
    if len(set(every)) != len(every):
        raise _bad(path, "secondary", raw["secondary"], "comparisons that differ from each other and from the primary")
    return Plan(
        path=path,
        experiment=experiment,
        seeds=tuple(seeds),
        endpoint=raw["endpoint"],
        metric=metric,
        benchmark=raw["benchmark"],
        test=raw["test"],
        alpha=alpha,
        equivalence_margin=margin,
        primary=primary,
        secondary=secondary,
        study=study,
    )


def _bad(path: Path, key: str, value: Any, allowed: str) -> PlanError:
    return PlanError(f"{path}: {key} is {value!r}; allowed: {allowed}")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _comparison(value: Any, key: str, path: Path) -> Comparison:
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(m, str) and m for m in value)
    if not ok or value[0] == value[1]:
        raise _bad(path, key, value, "[A, B]: two different method names (A − B is tested)")
    return Comparison(value[0], value[1])


def gatekept(p_primary: float, p_secondary: list[float], alpha: float) -> tuple[float, list[float], bool]:
    """(the primary's p, each secondary's adjusted p, whether the gate is open) under serial gatekeeping: the
    primary at α alone; a secondary's adjusted p is max(p_primary, its Holm p among the secondaries)."""
    holm = stats.holm(p_secondary) if p_secondary else []
    return p_primary, [max(p_primary, p) for p in holm], stats.significant(p_primary, alpha)


# ------------------------------------------------------------------------------------------ git provenance
def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class PlanCommit:
    commit: str  # the commit that last changed the plan file
    uncommitted: bool  # the file differs from that commit now


def plan_commit(plan_path: Path) -> PlanCommit:
    """The git commit that last changed the plan file; PlanError when it is not committed (or not in git)."""
    plan_path = Path(plan_path).resolve()
    try:
        found = _git(["log", "-1", "--format=%H", "--", plan_path.name], plan_path.parent)
        status = _git(["status", "--porcelain", "--", plan_path.name], plan_path.parent)
    except (OSError, subprocess.SubprocessError) as err:
        raise PlanError(f"{plan_path}: cannot ask git for the plan's commit ({err})") from None
    commit = found.stdout.strip()
    if found.returncode != 0 or not commit:
        raise PlanError(
            f"{plan_path}: the plan is not committed in git ({found.stderr.strip() or 'no commit changes it'}); "
            "commit it before the experiment's first run"
        )
    return PlanCommit(commit, bool(status.stdout.strip()))


def runs_against_plan(run_paths: list[Path], plan_path: Path, commit: str) -> list[str]:
    """Lines naming the runs whose env.json commit does not descend from the plan's `commit` (made before the plan
    existed, or under an earlier version of it) and those that cannot be verified; empty when all descend."""
    plan_path = Path(plan_path).resolve()
    groups: dict[str, list[str]] = {}
    for run in sorted(run_paths, key=lambda p: Path(p).name):
        groups.setdefault(_run_status(Path(run), plan_path, commit), []).append(Path(run).name)
    groups.pop("", None)
    return [f"{reason}: {', '.join(names)}" for reason, names in sorted(groups.items())]


def _run_status(run: Path, plan_path: Path, commit: str) -> str:
    """'' when the run's commit descends from `commit`, else why it is flagged."""
    env = run / rundir.ENV_FILE
    recorded = rundir.read_json(env).get("git_commit") if env.exists() else None
    if not recorded:
        return f"cannot verify ({rundir.ENV_FILE} records no git commit)"
    run_commit = str(recorded).removesuffix("-dirty")
    ancestry = _git(["merge-base", "--is-ancestor", commit, run_commit], plan_path.parent)
    if ancestry.returncode == 0:
        return ""
    if ancestry.returncode != 1:
        return "cannot verify (the run's git commit is not in this repository)"
    existed = _git(["cat-file", "-e", f"{run_commit}:./{plan_path.name}"], plan_path.parent).returncode == 0
    short = commit[:12]
    if existed:
        return f"made under an earlier version of the plan (its commit does not descend from the plan's {short})"
    return f"made before the plan existed (its commit does not descend from the plan's {short})"
