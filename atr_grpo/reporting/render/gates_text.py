"""The design gates as Markdown, under `compare`'s plan table and in the notes of `results all`: the amendments
that apply, each gate's verdict, and the noise numbers reported beside them. The numbers are `analyses/gates.py`'s."""

from __future__ import annotations

from atr_grpo.reporting.analyses.gates import GateResult, gate_notes
from atr_grpo.reporting.plan import Plan


def amendment_lines(plan: Plan) -> list[str]:
    """One line per amendment of the plan, with its date and the deviation it states."""
    return [f"**{a.describe()}**" for a in plan.amendments]


def gate_lines(result: GateResult, plan: Plan) -> list[str]:
    """Markdown: the amendments, then per model the validity gate, each planned comparison's precision gate, and
    what is reported without gating."""
    lines = ["## Design gates", "", *amendment_lines(plan)]
    for model, v in result.validity.items():
        verdict = "pass" if result.passes(model) else "fail"
        lines += [
            "",
            f"{model}: the design gates {verdict}.",
            "",
            f"- validity {'passes' if v.passes else 'fails'}: {v.streams_note}; cross-seed residual correlation "
            f"r̄ {v.correlation:+.4f} (pairs {v.correlation_low:+.3f} to {v.correlation_high:+.3f}, {v.pairs} run "
            f"pairs), within ±{v.threshold:g}: {'yes' if abs(v.correlation) < v.threshold else 'no'}",
            "",
            "| comparison | level | SD_d | MDE (sign flip) | MDE (paired t) | limit | precision | σ_e | noise share "
            "[95% χ²] | MDE at K → ∞ |",
            "|---|---:|---:|---:|---:|---:|---|---:|---|---:|",
        ]
        for p in (p for p in result.precision if p.model == model):
            lines.append(
                f"| {p.label} | {p.level:.3g} | {p.sd:.3f} | {p.mde:.2f} | {p.mde_t:.2f} | {p.limit:g} | "
                f"{'passes' if p.passes else 'fails'} | {p.evaluation_sd:.3f} | {100 * p.noise_share:.0f} % "
                f"[{100 * p.share_low:.0f} %, {100 * p.share_high:.0f} %] | {p.mde_infinite:.2f} |"
            )
    lines += ["", *gate_notes(plan)]
    return lines


def verdict_lines(result: GateResult) -> list[str]:
    """One line per model: both gates' verdicts and the numbers that decide them."""
    lines = []
    for model, v in result.validity.items():
        rows = [p for p in result.precision if p.model == model]
        worst = max(rows, key=lambda p: p.mde / p.limit)
        lines.append(
            f"gates: {model}: {'pass' if result.passes(model) else 'FAIL'}; validity "
            f"{'passes' if v.passes else 'fails'} (r̄ {v.correlation:+.4f} within ±{v.threshold:g}; {v.streams_note}); "
            f"precision {'passes' if all(p.passes for p in rows) else 'fails'} ({sum(p.passes for p in rows)} of "
            f"{len(rows)}; largest MDE {worst.mde:.2f} for {worst.label}, limit {worst.limit:g})"
        )
    return lines
