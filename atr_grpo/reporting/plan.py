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
    secondary_metrics:              # optional: the primary comparison on other metrics, e.g. Mean@K's parts
      - answered@8
      - acc_given_answer@8
    study: lr_sweep                 # optional: the study whose methods these are (the runs' `study`)
    gates:                          # optional: the design gates (`analyses/gates.py`)
      max_residual_correlation: 0.05  # validity: |r̄| of the cross-seed evaluation residuals below this
      max_mde_share_of_margin: 0.5    # precision: every planned MDE ≤ this share of the equivalence margin

Its methods are resolved in one study: the one it names, else the one its experiment's runs belong to. Runs of the
experiment in several studies, with no `study:` to choose, are refused: pairing atr of one study with clip of another
would compare two settings at once.

The family is tested by serial gatekeeping (Westfall & Krishen 2001; Dmitrienko et al. 2003): the primary alone at
α; the secondaries only when the primary rejects, then by Holm among themselves at α. A secondary's adjusted p is
max(p of the primary, its Holm p), so it rejects exactly when the gate is open and Holm rejects it; the family-wise
error stays ≤ α. When the primary does not reject, no secondary is tested, whatever its p. The secondaries are the
`secondary` comparisons on `metric`, then the primary comparison on each of `secondary_metrics`: one Holm family.

An amendment is a dated file beside the plan, `plan_amendment_<YYYY-MM-DD>.yaml`, written after the plan was
committed. It may only (re)state the gates, never the comparisons, α, the margin or the seeds, and it says why:

    amends: plan.yaml
    date: 2026-12-05                # the date in its file name
    deviation: the docs' design check is replaced by ...
    gates: {max_residual_correlation: 0.05, max_mde_share_of_margin: 0.5}

`load_plan` reads every amendment in date order; the last one's gates apply. The commands print that an amendment
applies, with its date, so a reader sees the deviation beside the verdicts.

The plan's commit is the git commit that last changed the file. A run made from a commit that does not descend from
it was made before the plan existed or under an earlier version of it: `runs_against_plan` names such runs.
"""

from __future__ import annotations

import datetime
import math
import re
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
OPTIONAL_KEYS = ("study", "gates", "secondary_metrics", "final_evaluation")
FINAL_KEYS = ("folder", "temperature", "top_p")
GATE_KEYS = ("max_residual_correlation", "max_mde_share_of_margin")
AMENDMENT_KEYS = ("amends", "date", "deviation", "gates")
AMENDMENT_NAME = re.compile(r"plan_amendment_(\d{4}-\d{2}-\d{2})\.yaml")


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
class Gates:
    """The design gates a plan fixes (`analyses/gates.py` checks them)."""

    max_residual_correlation: float  # validity: |r̄| of the cross-seed evaluation residuals must be below it
    max_mde_share_of_margin: float  # precision: each planned comparison's MDE ≤ this × the equivalence margin


@dataclass(frozen=True)
class FinalEvaluation:
    """One more evaluation of each run's final adapter at other sampling settings (`python -m atr_grpo.final_eval`),
    written to `<run>/<folder>/`; the primary comparison on it is one more secondary."""

    folder: str  # a folder name inside each run folder
    temperature: float
    top_p: float

    def describe(self) -> str:
        return f"{self.folder}: the final adapters at temperature {self.temperature:g}, top-p {self.top_p:g}"


@dataclass(frozen=True)
class Amendment:
    """A dated amendment beside the plan: it restates the gates and says why (a deviation from the plan)."""

    path: Path
    date: str  # ISO, as in the file name
    deviation: str
    gates: Gates

    def describe(self) -> str:
        return f"amendment {self.path.name} (dated {self.date}) applies: {self.deviation}"


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
    gates: Gates | None = None  # the plan's own, or the last amendment's
    amendments: tuple[Amendment, ...] = ()
    secondary_metrics: tuple[str, ...] = ()  # the primary comparison on these metrics, as secondaries
    study: str | None = None  # None: the one study of the experiment's runs
    final_evaluation: FinalEvaluation | None = None

    @property
    def secondary_count(self) -> int:
        """The secondaries of the family: the comparisons, the secondary metrics and the final evaluation."""
        return len(self.secondary) + len(self.secondary_metrics) + (self.final_evaluation is not None)

    def level(self, role: str) -> float:
        """The level a comparison's test uses: α for the primary, Holm's first step among the secondaries."""
        return self.alpha if role == PRIMARY else stats.holm_level(self.alpha, self.secondary_count)

    def hypotheses(self) -> list[tuple[str, Comparison, str]]:
        """(role, comparison, metric) of every planned test on the runs' own evaluations, the primary first, then
        the secondaries in order; the final evaluation's test (`final_evaluation`) comes after them."""
        return [
            (PRIMARY, self.primary, self.metric),
            *((SECONDARY, comparison, self.metric) for comparison in self.secondary),
            *((SECONDARY, self.primary, metric) for metric in self.secondary_metrics),
        ]


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
    allowed = (*KEYS, *OPTIONAL_KEYS)
    unknown, missing = sorted(set(raw) - set(allowed)), [k for k in KEYS if k not in raw]
    if unknown:
        raise PlanError(f"{path}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(allowed)}")
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
    gates = _gates(raw["gates"], path) if "gates" in raw else None
    secondary_metrics = _secondary_metrics(raw.get("secondary_metrics", []), metric, path)
    final = _final_evaluation(raw["final_evaluation"], path) if "final_evaluation" in raw else None
    amendments = load_amendments(path)
    if amendments:
        gates = amendments[-1].gates
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
        gates=gates,
        amendments=amendments,
        secondary_metrics=secondary_metrics,
        study=study,
        final_evaluation=final,
    )


def _secondary_metrics(value: Any, metric: str, path: Path) -> tuple[str, ...]:
    """`secondary_metrics`: distinct metric names other than the plan's `metric`."""
    ok = isinstance(value, list) and all(isinstance(m, str) and Metric.is_name(m) for m in value)
    if not ok or len(set(value)) != len(value) or metric in value:
        raise _bad(path, "secondary_metrics", value, f"a list of distinct metrics other than {metric!r}: {EXPECTED}")
    return tuple(value)


def _final_evaluation(value: Any, path: Path) -> FinalEvaluation:
    """`final_evaluation`: a folder name and the sampling of the final adapters' evaluation."""
    if not isinstance(value, dict) or sorted(value) != sorted(FINAL_KEYS):
        raise _bad(path, "final_evaluation", value, f"a mapping with exactly the keys {', '.join(FINAL_KEYS)}")
    folder = value["folder"]
    if not isinstance(folder, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", folder) or folder in (".", "..", "eval"):
        raise _bad(path, "final_evaluation.folder", folder, "a folder name (letters, digits, _ . -) other than eval")
    temperature, top_p = _number(value["temperature"]), _number(value["top_p"])
    if temperature is None or not 0 < temperature < math.inf:
        raise _bad(path, "final_evaluation.temperature", value["temperature"], "a number > 0")
    if top_p is None or not 0 < top_p <= 1:
        raise _bad(path, "final_evaluation.top_p", value["top_p"], "a number in (0, 1]")
    return FinalEvaluation(folder, temperature, top_p)


def _gates(value: Any, path: Path, key: str = "gates") -> Gates:
    """The `gates` mapping, checked key by key."""
    if not isinstance(value, dict):
        raise _bad(path, key, value, f"a mapping with the keys {', '.join(GATE_KEYS)}")
    unknown, missing = sorted(set(value) - set(GATE_KEYS)), [k for k in GATE_KEYS if k not in value]
    if unknown or missing:
        raise _bad(path, key, value, f"exactly the keys {', '.join(GATE_KEYS)}")
    correlation = _number(value["max_residual_correlation"])
    if correlation is None or not 0 < correlation < 1:
        raise _bad(path, f"{key}.max_residual_correlation", value["max_residual_correlation"], "a number in (0, 1)")
    share = _number(value["max_mde_share_of_margin"])
    if share is None or not 0 < share <= 1:
        raise _bad(path, f"{key}.max_mde_share_of_margin", value["max_mde_share_of_margin"], "a number in (0, 1]")
    return Gates(correlation, share)


def load_amendments(plan_path: Path) -> tuple[Amendment, ...]:
    """The amendments beside `plan_path` (`plan_amendment_<date>.yaml`), in date order, each checked."""
    found = []
    for path in sorted(Path(plan_path).parent.glob("plan_amendment_*.yaml")):
        named = AMENDMENT_NAME.fullmatch(path.name)
        if named is None:
            raise PlanError(f"{path}: an amendment is named plan_amendment_YYYY-MM-DD.yaml")
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise PlanError(f"{path}: cannot read the amendment ({err})") from None
        if not isinstance(raw, dict) or set(raw) != set(AMENDMENT_KEYS):
            keys = sorted(map(str, raw)) if isinstance(raw, dict) else raw
            raise _bad(path, "the keys", keys, f"exactly {', '.join(AMENDMENT_KEYS)} (an amendment restates the gates)")
        if raw["amends"] != Path(plan_path).name:
            raise _bad(path, "amends", raw["amends"], f"the plan beside it, {Path(plan_path).name}")
        date = raw["date"].isoformat() if isinstance(raw["date"], datetime.date) else str(raw["date"])
        if date != named.group(1):
            raise _bad(path, "date", raw["date"], f"the date in the file name, {named.group(1)}")
        if not isinstance(raw["deviation"], str) or not raw["deviation"].strip():
            raise _bad(path, "deviation", raw["deviation"], "what the amendment changes and why, in words")
        found.append(Amendment(path, date, " ".join(raw["deviation"].split()), _gates(raw["gates"], path)))
    return tuple(found)


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
