"""The papers' claims, answered from the studies in the store: `hmer report --claims`.

    df = claims_table("cpu")              # one row per claim, comparison and test year
    print(format_claims(df))              # aligned text; fmt="markdown" for a README

A claim is a row of `CLAIMS`, the one place that says which study answers it, which variants it
compares, which side it says wins and which paper makes it; adding a claim is adding a row there
(and, when the paper gives figures for it, rows to `paper_claims.csv`). A claim that orders more
than two variants (CoMER: fusion > cross, self > none) is several comparisons, each one
(claimed winner, claimed loser) pair.

Each comparison is a variant table (`hmer.reports.tables.variant_table`) of the study's runs of
its two variants with the claimed loser as the baseline, so the difference, its interval and
both paired tests are computed exactly as `hmer report --study` computes them, on the same
`measure` (`exprate`, or `le1`/`le2`: read within one or two edits). The verdict uses the larger
of the two p-values (`verdict`). A study that has not finished (kept in the store to be
continued, `hmer runs publish --keep-unfinished`) answers nothing yet: its rows say how far it is
("in progress, 4 of 9 trials finished") instead of numbers that its other cells would change.

The papers' own figures live in `paper_claims.csv` (package data: claim, variant, year,
measure, value, paper, source, note), one row per figure with where it stands: ExpRate, and ≤1 /
≤2 where the paper gives them, so that `measure="le2"` shows the paper's ≤2 beside ours. A figure
that was not found in a source that can be cited has no row, and its cell is empty.

"claims" alone already names something else in this project: workers claiming grid cells
(`hmer.studies.claims`). Here a claim is a paper's, hence the module's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Sequence

import pandas as pd

from .markup import MISSING, bold, is_missing, layout, mean_pm_std, measure_label, measures, p_value
from .runs import PredictionsNotFound, load_predictions, load_runs, resolve_tracking_uri, scored_years, study_progress
from .significance import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES
from .tables import scored, variant_table

ALPHA = 0.05  # the level of the verdict, matching the 95 % interval

REPRODUCED = "reproduced"
NOT_SIGNIFICANT = "not significant"
REVERSED = "reversed"
NO_STUDY = "no study yet"
NO_TEST = "no paired test"  # the runs logged no predictions to pair


@dataclass(frozen=True)
class Claim:
    """A claim of the field and the study that answers it.

    Attributes:
        name: short key, also the `claim` column of `paper_claims.csv`.
        statement: the claim in words.
        paper: who makes it ("" when no single paper does).
        study: the study family; its runs are those of the study `<study>-<budget>`.
        comparisons: (claimed winner, claimed loser) variant labels of that study.
    """

    name: str
    statement: str
    paper: str
    study: str
    comparisons: tuple[tuple[str, str], ...]

    def study_name(self, budget: str) -> str:
        return f"{self.study}-{budget}"


CLAIMS: tuple[Claim, ...] = (
    Claim("direction", "bidirectional training beats left-to-right", "BTTR (Zhao et al., ICDAR 2021)",
          "ablate_direction", (("bi", "l2r"),)),
    Claim("coverage", "attention refinement with fusion coverage beats cross and self coverage, which beat none",
          "CoMER (Zhao & Gao, ECCV 2022)", "ablate_coverage",
          (("fusion", "none"), ("fusion", "cross"), ("fusion", "self"), ("cross", "none"), ("self", "none"))),
    Claim("decoder", "a transformer decoder beats a GRU with coverage attention (WAP) and the convolutional decoder",
          "", "ablate_decoder", (("transformer", "rnn"), ("transformer", "convs2s"))),
    # BTTR adds a 2-D sinusoidal encoding to the image features so that attention can find regions, but
    # reports no run without it; CAPE (content-aware, StyTr²) and learned absolute positions (ConvS2S)
    # are the alternatives this suite builds. No HMER paper compares them, so no row has a paper figure.
    Claim("posenc", "a 2-D sinusoidal image positional encoding beats none (BTTR's motivation for it), and "
          "content-aware (CAPE) or learned positions beat the 2-D sinusoids (the alternatives' hypotheses)",
          "no HMER paper reports these comparisons: BTTR (Zhao et al., ICDAR 2021) motivates its 2-D encoding "
          "without a run without it; CAPE is StyTr²'s (Deng et al., CVPR 2022, style transfer); learned "
          "absolute positions are ConvS2S's (Gehring et al., ICML 2017, for sequences)",
          "ablate_posenc", (("sin2d", "none"), ("cape", "sin2d"), ("learned", "sin2d"))),
)
NO_SINGLE_PAPER = "no single paper: the design's ablation grid"

# Within one / two errors means two things in this table. The papers' ≤1 / ≤2 columns are the official CROHME
# tools' (lgeval over symbol label graphs, as CoMER's repository runs them); ours count token edits
# (`hmer.evaluation.metrics`). On the same predictions the two disagree by points, which is why the columns are
# labelled apart and a paper's figure on them is context, never a target; the verdicts compare our runs with
# each other, always on the token measure.
EDIT_MEASURES_DIFFER = (
    "Within one / two errors: the papers' figures (lgeval) count errors in the symbol label graph (symbols, "
    "relations and segmentation) as the official CROHME tools do; ours count token edits (Levenshtein over the "
    "LaTeX tokens). They are different measures: on the same 2014 predictions (run 7ef3f758 of cpu-best, "
    "the previous best CPU model) the official pipeline read 26.57 / 31.64 % within one / two graph errors "
    "where the token measure reads 28.30 / 36.71 % (their ExpRates agree). The verdicts compare our runs on "
    "the token measure only.")

COLUMNS = ["claim", "study", "winner", "loser", "year", "paper_winner", "paper_loser", "seeds_winner",
           "seeds_loser", "winner_mean", "winner_std", "loser_mean", "loser_std", "delta", "delta_low",
           "delta_high", "p_bootstrap", "p_mcnemar", "p", "verdict"]
_FIGURE_COLUMNS = ["claim", "variant", "year", "measure", "value", "paper", "source", "note"]


# ---- the papers' figures ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _figures() -> pd.DataFrame:
    with resources.files(__package__).joinpath("paper_claims.csv").open("r", encoding="utf-8") as f:
        df = pd.read_csv(f, dtype={"year": str, "claim": str, "variant": str, "measure": str},
                         keep_default_na=False)
    missing = set(_FIGURE_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"hmer/reports/paper_claims.csv lacks the column(s) {', '.join(sorted(missing))}")
    unknown = set(df["measure"]) - set(measures())
    if unknown:
        raise ValueError(f"hmer/reports/paper_claims.csv: unknown measure(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(measures())}")
    df["value"] = pd.to_numeric(df["value"], errors="raise")
    return df[_FIGURE_COLUMNS]


def paper_figures() -> pd.DataFrame:
    """Every figure the papers give for a side of a claim: claim, variant, year, measure, value (%), paper,
    source, note."""
    return _figures().copy()


def paper_figure(claim: str, variant: str, year: str, measure: str = "exprate") -> float:
    """The paper's figure (%) on `measure` for that side of the claim and year; NaN when none was found."""
    df = _figures()
    hit = df[(df["claim"] == claim) & (df["variant"] == variant) & (df["year"] == str(year))
             & (df["measure"] == measure)]
    return float(hit["value"].iloc[0]) if not hit.empty else math.nan


# ---- the verdict ----------------------------------------------------------------------------------

def verdict(delta: float, p_bootstrap: float, p_mcnemar: float, alpha: float = ALPHA) -> str:
    """In words, for the difference claimed winner minus claimed loser: `reproduced` when both
    paired tests reject at `alpha` (the larger p is below it) and the winner is ahead, `reversed`
    when they reject with the loser ahead, else `not significant`; `no paired test` without p-values."""
    if is_missing(delta) or is_missing(p_bootstrap) or is_missing(p_mcnemar):
        return NO_TEST
    if max(p_bootstrap, p_mcnemar) >= alpha or delta == 0:
        return NOT_SIGNIFICANT
    return REPRODUCED if delta > 0 else REVERSED


# ---- the table ------------------------------------------------------------------------------------

def _cached_loader(tracking_uri: str) -> Callable[[str, str], pd.DataFrame]:
    """`load_predictions` that fetches each artifact once across the comparisons of a study."""
    cache: dict[tuple[str, str], pd.DataFrame | PredictionsNotFound] = {}

    def load(run_id: str, year: str) -> pd.DataFrame:
        key = (run_id, str(year))
        if key not in cache:
            try:
                cache[key] = load_predictions(run_id, year, tracking_uri)
            except PredictionsNotFound as exc:
                cache[key] = exc
        hit = cache[key]
        if isinstance(hit, PredictionsNotFound):
            raise hit
        return hit

    return load


def claims_table(
    budget: str = "cpu",
    tracking_uri: str | None = None,
    *,
    measure: str = "exprate",
    claims: Sequence[Claim] = CLAIMS,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    alpha: float = ALPHA,
) -> pd.DataFrame:
    """One row per claim, comparison and test year (see the module docstring). A claim whose study
    `<study>-<budget>` has no scored run in the store gets, per comparison, a row per year the paper
    gives figures for (one row, year empty, when it gives none), verdict `no study yet`; one whose
    study has not finished, the same rows with its progress as the verdict. Means, stds
    and differences are percent on `measure`."""
    uri = resolve_tracking_uri(tracking_uri)
    rows: list[dict[str, Any]] = []
    for claim in claims:
        study = claim.study_name(budget)
        runs = load_runs(uri, study=study)
        good = runs[scored(runs)] if not runs.empty else runs
        # a study still training answers nothing yet: its finished cells are not its answer
        progress = study_progress(study, uri)
        if good.empty or progress:
            # the paper's figures still show, a row per year it gives them for (one row, year empty, without any)
            figures = _figures()
            paper_years = sorted(set(figures.loc[figures["claim"] == claim.name, "year"])) or [""]
            rows += [_empty_row(claim, study, winner, loser, y, measure, progress or NO_STUDY)
                     for winner, loser in claim.comparisons for y in paper_years]
            continue
        years = scored_years(runs)
        load = _cached_loader(uri)
        for winner, loser in claim.comparisons:
            present = set(good["variant"])
            absent = [v for v in (winner, loser) if v not in present]
            if absent:
                rows += [_empty_row(claim, study, winner, loser, y, measure, f"no runs of {' and '.join(absent)}")
                         for y in years]
                continue
            pair = runs[runs["variant"].isin([winner, loser])]
            table = variant_table(pair, baseline=loser, years=years, predictions=load, measure=measure,
                                  n_resamples=n_resamples, confidence=confidence, title=study)
            won, lost = table.loc[winner], table.loc[loser]
            for year in years:
                row = _empty_row(claim, study, winner, loser, year, measure, "")
                cells = {k: won.get(f"{year}_{k}") for k in ("delta", "delta_low", "delta_high", "p_bootstrap",
                                                               "p_mcnemar")}
                row.update(cells)
                row.update({
                    "seeds_winner": int(won["seeds"]), "seeds_loser": int(lost["seeds"]),
                    "winner_mean": won.get(f"{year}_{measure}_mean"), "winner_std": won.get(f"{year}_{measure}_std"),
                    "loser_mean": lost.get(f"{year}_{measure}_mean"), "loser_std": lost.get(f"{year}_{measure}_std"),
                    "p": max(cells["p_bootstrap"], cells["p_mcnemar"])
                    if not (is_missing(cells["p_bootstrap"]) or is_missing(cells["p_mcnemar"])) else math.nan,
                    "verdict": verdict(cells["delta"], cells["p_bootstrap"], cells["p_mcnemar"], alpha),
                })
                rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update({"budget": budget, "measure": measure, "confidence": confidence, "alpha": alpha,
                     "n_resamples": n_resamples, "claims": list(claims)})
    return df


def _empty_row(claim: Claim, study: str, winner: str, loser: str, year: str, measure: str,
               word: str) -> dict[str, Any]:
    """A row with the claim, the paper's figures on `measure` where it gives them, and no measurement."""
    row: dict[str, Any] = {c: math.nan for c in COLUMNS}
    row.update({"claim": claim.name, "study": study, "winner": winner, "loser": loser, "year": year,
                "paper_winner": paper_figure(claim.name, winner, year, measure) if year else math.nan,
                "paper_loser": paper_figure(claim.name, loser, year, measure) if year else math.nan, "verdict": word})
    return row


# ---- as text or Markdown --------------------------------------------------------------------------

def format_claims(df: pd.DataFrame, fmt: str = "text") -> str:
    """The claims table, then what each claim says and who says it, and where the papers' figures are from."""
    render = layout(fmt)
    strong = bold(fmt)
    label = measure_label(df.attrs.get("measure", "exprate"))
    confidence = float(df.attrs.get("confidence", DEFAULT_CONFIDENCE))
    alpha = float(df.attrs.get("alpha", ALPHA))
    measure = df.attrs.get("measure", "exprate")
    # within one / two errors are two different measures on the two sides (see EDIT_MEASURES_DIFFER)
    paper_label, ours_label = (label, label) if measure == "exprate" else (f"{label} lgeval", f"{label} tokens")
    head = ["claim", "year", "claimed", f"paper {paper_label}", f"ours {ours_label} (winner)",
            f"ours {ours_label} (loser)", f"Δ {ours_label} [{confidence:.0%} CI]", "p boot / McNemar", "verdict"]
    body = []
    for _, r in df.iterrows():
        paper = (MISSING if is_missing(r["paper_winner"]) and is_missing(r["paper_loser"])
                 else f"{_figure(r['paper_winner'])} / {_figure(r['paper_loser'])}")
        delta = MISSING if is_missing(r["delta"]) else (
            f"{r['delta']:+.1f}" if is_missing(r["delta_low"])
            else f"{r['delta']:+.1f} [{r['delta_low']:+.1f}, {r['delta_high']:+.1f}]")
        tests = MISSING if is_missing(r["p_bootstrap"]) else f"{p_value(r['p_bootstrap'])} / {p_value(r['p_mcnemar'])}"
        body.append([r["claim"], r["year"] or MISSING, f"{r['winner']} > {r['loser']}", paper,
                     _ours(r, "winner"), _ours(r, "loser"), delta, tests, r["verdict"]])
    budget = df.attrs.get("budget", "")
    intro = (f"{strong('The papers’ claims')} against the studies at the {budget} budget: ours are mean ± std over "
             f"seeds (%, the number of seeds in brackets); Δ = claimed winner − claimed loser in percentage points "
             f"with its paired-bootstrap interval; p = paired bootstrap over test expressions / exact McNemar over "
             f"seed-matched pairs. Verdict at α = {alpha:g} on the larger p: {REPRODUCED} (significant in the "
             f"claimed direction), {NOT_SIGNIFICANT}, or {REVERSED} (significant against the claim).")
    claims = df.attrs.get("claims", CLAIMS)
    notes = [f"- {c.name}: {c.statement}; {c.paper or NO_SINGLE_PAPER}; study {c.study_name(budget)}"
             for c in claims]
    figures = _figures()
    sources = []
    for (claim, variant), part in figures.groupby(["claim", "variant"], sort=False):
        where = "; ".join(f"{', '.join(measure_label(m) for m in sub['measure'].unique())} from {source}"
                          for source, sub in part.groupby("source", sort=False))
        sources.append(f"- {claim}, {variant}: {part.iloc[0]['paper']}. {where}. Note: {part.iloc[0]['note']}.")
    paper_note = (f"Paper {paper_label} = the paper's figure for the claimed winner / loser; {MISSING} where it was "
                  "not found in a source that can be cited:")
    blocks = [intro, render(head, body), "Claims:\n" + "\n".join(notes), paper_note + "\n" + "\n".join(sources)]
    if measure != "exprate":
        blocks.append(EDIT_MEASURES_DIFFER)
    return "\n\n".join(blocks) + "\n"


def _figure(value: Any) -> str:
    return MISSING if is_missing(value) else f"{float(value):.2f}"


def _ours(row: pd.Series, side: str) -> str:
    mean = row[f"{side}_mean"]
    if is_missing(mean):
        return MISSING
    return f"{mean_pm_std(mean, row[f'{side}_std'])} ({int(row[f'seeds_{side}'])})"
