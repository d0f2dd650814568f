"""`format_claims`: the claims table (`hmer.reports.paper_claims`) as aligned text or Markdown, with what
each claim says, where the papers' figures are from, and which measure each side of the table is on.

    print(format_claims(claims_table(measure="le2"), "markdown"))

Within one / two errors, three columns can be set side by side, and their headers say which is which:
the paper's figures (`paper ≤2 lgeval`), ours on the same measure where the runs carry it (`ours ≤2
lgeval`, with Δ and the tests on it), and ours on token edits (`ours ≤2 tokens`), the suite's own measure,
which the table is on where the runs lack lgeval's (`paper_claims.measure_sides`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .markup import MISSING, bold, is_missing, layout, mean_pm_std, measure_label, p_value
from .paper_claims import (ALPHA, CLAIMS, NO_SINGLE_PAPER, NOT_SIGNIFICANT, REPRODUCED, REVERSED, SPLIT,
                           paper_figures)
from ..evaluation.significance import DEFAULT_CONFIDENCE

# Within one / two errors means two things when the table is on token edits. The papers' ≤1 / ≤2 columns are the
# official CROHME tools' (lgeval over symbol label graphs, as CoMER's repository runs them); ours count token
# edits (`hmer.evaluation.metrics`). On the same predictions the two disagree by points, which is why the columns
# are labelled apart and a paper's figure on them is context, never a target; the verdicts compare our runs with
# each other, on the token measure.
EDIT_MEASURES_DIFFER = (
    "Within one / two errors: the papers' figures (lgeval) count errors in the symbol label graph (symbols, "
    "relations and segmentation) as the official CROHME tools do; ours count token edits (Levenshtein over the "
    "LaTeX tokens). They are different measures: on the same 2014 predictions (run 7ef3f758 of cpu-best, "
    "the previous best CPU model) the official pipeline read 26.57 / 31.64 % within one / two graph errors "
    "where the token measure reads 28.30 / 36.71 % (their ExpRates agree). The verdicts compare our runs on "
    "the token measure only.")
# ... and one thing when the runs carry the papers' measure: ours counted as the papers count.
ON_THE_PAPERS_MEASURE = (
    "Within one / two errors, on the papers' measure: ours (lgeval) count errors in the symbol label graph as "
    "the official CROHME tools do (hmer.evaluation.lgeval, which gives their figures expression for expression), "
    "the measure of the papers' figures; Δ and both tests are on it, over the expressions whose truth converts "
    "to a graph. Ours (tokens) are the suite's own measure, token edits (Levenshtein over the LaTeX tokens), on "
    "the same runs: it reads a few points higher (run 7ef3f758 of cpu-best, 2014: 28.30 / 36.71 % within one / "
    "two token edits, 26.57 / 31.64 % within one / two graph errors).")


def format_claims(df: pd.DataFrame, fmt: str = "text", *, sources: bool = True) -> str:
    """The claims table, then what each claim says and who says it, and where the papers' figures are from.
    With `sources=False`, for a further measure printed under the first: a line naming the measure, the table
    and what its measure is, without repeating the claims and the papers' sources."""
    render = layout(fmt)
    strong = bold(fmt)
    confidence = float(df.attrs.get("confidence", DEFAULT_CONFIDENCE))
    alpha = float(df.attrs.get("alpha", ALPHA))
    measure = df.attrs.get("measure", "exprate")
    token = df.attrs.get("token_measure", measure)
    label = measure_label(token)
    on_graphs = measure != token  # ours on the papers' measure, our token measure kept beside it
    # the papers' ≤1 / ≤2 are lgeval's; ours are on it or on token edits (EDIT_MEASURES_DIFFER)
    paper_label, ours_label = (label, label) if token == "exprate" and not on_graphs else (
        f"{label} lgeval", f"{label} lgeval" if on_graphs else f"{label} tokens")
    kept = [f"ours {label} tokens (winner)", f"ours {label} tokens (loser)"] if on_graphs else []
    head = ["claim", "budget", "year", "claimed", f"paper {paper_label}", f"ours {ours_label} (winner)",
            f"ours {ours_label} (loser)", *kept, f"Δ {ours_label} [{confidence:.0%} CI]", "p boot", "p all seeds",
            "verdict, all seeds", "p McNemar per seed pair", "verdict, per-seed McNemar"]
    body = []
    for _, r in df.iterrows():
        paper = (MISSING if is_missing(r["paper_winner"]) and is_missing(r["paper_loser"])
                 else f"{_figure(r['paper_winner'])} / {_figure(r['paper_loser'])}")
        delta = MISSING if is_missing(r["delta"]) else (
            f"{r['delta']:+.1f}" if is_missing(r["delta_low"])
            else f"{r['delta']:+.1f} [{r['delta_low']:+.1f}, {r['delta_high']:+.1f}]")
        pairs = MISSING if not isinstance(r["p_mcnemar_pairs"], tuple) else " ".join(
            _sided_p(p, favours, r) for p, favours in zip(r["p_mcnemar_pairs"], r["mcnemar_favours"]))
        tokens = [_ours(r, "winner", "_token"), _ours(r, "loser", "_token")] if on_graphs else []
        body.append([r["claim"], r["budget"], r["year"] or MISSING, f"{r['winner']} > {r['loser']}", paper,
                     _ours(r, "winner"), _ours(r, "loser"), *tokens, delta, p_value(r["p_bootstrap"]),
                     _sided_p(r["p_sign_flip"], r["sign_flip_favours"], r), r["verdict"], pairs,
                     r["verdict_mcnemar"]])
    budgets = list(df.attrs.get("budgets", ()))
    at = " and ".join(f"the {b}" for b in budgets) + (" budgets" if len(budgets) > 1 else " budget")
    intro = (f"{strong('The papers’ claims')} against the studies at {at} (column budget; "
             f"hmer.studies.budgets): ours are mean ± std over seeds (%, the number of seeds in brackets; one "
             f"seed is one run, with no std); Δ = claimed winner − claimed loser in percentage points "
             f"with its paired-bootstrap interval and p (p boot). Two tests, each with its verdict at α = {alpha:g}: "
             f"{REPRODUCED} (significant in the claimed direction), {NOT_SIGNIFICANT}, or {REVERSED} (significant "
             f"against the claim). All seeds: the exact paired sign-flip test over test expressions of the "
             f"seed-averaged difference (each expression once, its correctness averaged over each side's seeds). "
             f"Per-seed McNemar: the exact McNemar test of each seed-matched pair; their verdict when every pair "
             f"reads the same, else {SPLIT} with how many pairs read what. A + or - before a p is the side its test's "
             f"data favour: + the claimed winner, - the claimed loser, none a tie.")
    claims = df.attrs.get("claims", CLAIMS)
    notes = []
    for c in claims:
        studies = [s for s in dict.fromkeys(df.loc[df["claim"] == c.name, "study"])]
        notes.append(f"- {c.name}: {c.statement}; {c.paper or NO_SINGLE_PAPER}; "
                     f"{'studies' if len(studies) > 1 else 'study'} {', '.join(studies) or MISSING}")
    figures = paper_figures()
    cited = []
    for (claim, variant), part in figures.groupby(["claim", "variant"], sort=False):
        where = "; ".join(f"{', '.join(measure_label(m) for m in sub['measure'].unique())} from {source}"
                          for source, sub in part.groupby("source", sort=False))
        cited.append(f"- {claim}, {variant}: {part.iloc[0]['paper']}. {where}. Note: {part.iloc[0]['note']}.")
    paper_note = (f"Paper {paper_label} = the paper's figure for the claimed winner / loser; {MISSING} where it was "
                  "not found in a source that can be cited:")
    blocks = ([intro, render(head, body), "Claims:\n" + "\n".join(notes), paper_note + "\n" + "\n".join(cited)]
              if sources else
              [f"{strong('The same claims, ' + ours_label)}: columns, tests and verdicts as in the first table, "
               f"on this measure.", render(head, body)])
    if on_graphs:
        blocks.append(ON_THE_PAPERS_MEASURE)
    elif token != "exprate":
        blocks.append(EDIT_MEASURES_DIFFER)
    lacking = df.attrs.get("lacking") or []
    if lacking:
        blocks.append(f"Ours are on token edits because the runs of {', '.join(lacking)} do not carry the papers' "
                      f"measure (they were trained before it was registered): `hmer runs rescore` gives it to them "
                      f"from their stored predictions, and the table is then on it.")
    return "\n\n".join(blocks) + "\n"


def _sided_p(p: Any, favours: Any, row: pd.Series) -> str:
    """A p-value with the side its test favours: "+0.003" the claimed winner, "-0.003" the claimed loser."""
    if is_missing(p):
        return MISSING
    sign = "+" if favours == row["winner"] else "-" if favours == row["loser"] else ""
    return f"{sign}{p_value(p)}"


def _figure(value: Any) -> str:
    return MISSING if is_missing(value) else f"{float(value):.2f}"


def _ours(row: pd.Series, side: str, measure: str = "") -> str:
    """One side's mean ± std (seeds) on the table's measure, or with `measure="_token"` on our token measure."""
    mean = row[f"{side}{measure}_mean"]
    if is_missing(mean):
        return MISSING
    return f"{mean_pm_std(mean, row[f'{side}{measure}_std'])} ({int(row[f'seeds_{side}'])})"
