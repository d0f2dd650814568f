"""The papers' claims, answered from the studies in the store: `hmer report --claims`.

`claims_table()` has a row per claim, budget, comparison and test year, which `format_claims` prints. A
claim (`CLAIMS`) names its study, the (claimed winner, claimed loser) comparisons and its paper, whose
figures are rows of `paper_claims.csv`. Each comparison is a `variant_table` of its two variants, the
loser the baseline; the verdicts, budgets and metrics: docs/reports.md ("The papers' claims").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Sequence

import pandas as pd

from ..evaluation.lgeval import TOKEN_METRIC
from ..evaluation.significance import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES
from ..registry import METRICS
from .markup import MISSING, bold, difference, is_missing, layout, mean_pm_std, metric_label, number, p_value
from .published import package_csv
from .runs import load_predictions, load_runs, resolve_tracking_uri, scored_years, study_parent, study_progress
from .tables import grid_order, scored, variant_table

ALPHA = 0.05  # the level of the verdict, matching the 95 % interval

REPRODUCED = "reproduced"
NOT_SIGNIFICANT = "not significant"
REVERSED = "reversed"
SPLIT = "split"  # the seed pairs' McNemar verdicts differ: "split: 2 reversed, 1 not significant"
NO_STUDY = "no study yet"
NO_TEST = "no paired test"  # the runs logged no predictions to pair
NO_SINGLE_PAPER = "no single paper: the design's ablation grid"
# `cpu`'s three seeds of 13 epochs, then `long`'s one seed of 100 (hmer.studies.budgets)
DEFAULT_BUDGETS = ("cpu", "long")


@dataclass(frozen=True)
class Claim:
    """A claim (`name`: `paper_claims.csv`'s `claim`; `paper` "" when no single paper makes it), the
    study family answering it (`<study>-<budget>`) and its (claimed winner, claimed loser) labels."""

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
    # No HMER paper compares these, so no row has a paper figure.
    Claim("posenc", "a 2-D sinusoidal image positional encoding beats none (BTTR's motivation for it), and "
          "content-aware (CAPE) or learned positions beat the 2-D sinusoids (the alternatives' hypotheses)",
          "no HMER paper reports these comparisons: BTTR (Zhao et al., ICDAR 2021) motivates its 2-D encoding "
          "without a run without it; CAPE is StyTr²'s (Deng et al., CVPR 2022, style transfer); learned "
          "absolute positions are ConvS2S's (Gehring et al., ICML 2017, for sequences)",
          "ablate_posenc", (("sin2d", "none"), ("cape", "sin2d"), ("learned", "sin2d"))),
    # CAN reports CAN-DWAP against DWAP; the transformer rows and the parameter-matched control are ours.
    Claim("counting", "CAN's symbol counting improves the GRU decoder with coverage attention (CAN-DWAP over "
          "DWAP), and a transformer decoder too, also against a transformer of its parameters without counting",
          "CAN (Li et al., ECCV 2022)", "ablate_counting",
          (("rnn/True/384", "rnn/False/384"), ("transformer/True/384", "transformer/False/384"),
           ("transformer/True/384", "transformer/False/588"))),
)

# token metric -> the graph metric its table is on where the runs carry it (not ExpRate)
ON_GRAPHS = {token: graph for graph, token in TOKEN_METRIC.items() if token != "exprate"}
# What `hmer report --claims` answers each claim on when no metric is named: the papers' three columns
CLAIM_METRICS = ("exprate", "le1", "le2")

# `*_favours`: the side a test's data favour, the winner's or loser's name ("" neither); `*_pairs`: per
# seed pair; `winner_token_*` / `loser_token_*`: the same runs on our token metric
COLUMNS = ["claim", "budget", "study", "winner", "loser", "year", "metric", "paper_winner", "paper_loser",
           "seeds_winner", "seeds_loser", "winner_mean", "winner_std", "loser_mean", "loser_std", "winner_token_mean",
           "winner_token_std", "loser_token_mean", "loser_token_std", "delta", "delta_low", "delta_high",
           "p_bootstrap", "p_sign_flip", "sign_flip_favours", "verdict", "p_mcnemar", "p_mcnemar_pairs",
           "mcnemar_favours", "verdict_mcnemar"]
_FIGURE_COLUMNS = ["claim", "variant", "year", "metric", "value", "paper", "source", "note"]


# ---- the papers' figures ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _figures() -> pd.DataFrame:
    df = package_csv("paper_claims.csv", _FIGURE_COLUMNS, ["year", "claim", "variant", "metric"], "value")
    unknown = set(df["metric"]) - set(METRICS.names())
    if unknown:
        raise ValueError(f"hmer/reports/paper_claims.csv: unknown metric(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(METRICS.names())}")
    return df


def paper_figure(claim: str, variant: str, year: str, metric: str = "exprate") -> float:
    """The paper's figure (%) for that side, year and metric; NaN when none was found."""
    df = _figures()
    hit = df[(df["claim"] == claim) & (df["variant"] == variant) & (df["year"] == str(year))
             & (df["metric"] == metric)]
    return float(hit["value"].iloc[0]) if not hit.empty else math.nan


# ---- the verdict ----------------------------------------------------------------------------------

def verdict(p: float, favours: int, alpha: float = ALPHA) -> str:
    """`reproduced` (rejects at `alpha`, `favours` 1: the winner), `reversed` (-1), else `not
    significant`; `no paired test` without a p-value."""
    if is_missing(p):
        return NO_TEST
    if p >= alpha or favours == 0:
        return NOT_SIGNIFICANT
    return REPRODUCED if favours > 0 else REVERSED


def verdict_per_seed(p_pairs: Sequence[float], favours_pairs: Sequence[int], alpha: float = ALPHA) -> str:
    """Each seed pair's McNemar `verdict`: theirs when all agree, else e.g. `split: 2 reversed, 1 not
    significant`; so pairs significant for opposite sides never pass for agreement."""
    words = [verdict(p, favours, alpha) for p, favours in zip(p_pairs, favours_pairs)]
    if not words:
        return NO_TEST
    if len(set(words)) == 1:
        return words[0]
    return f"{SPLIT}: " + ", ".join(f"{words.count(w)} {w}" for w in (REPRODUCED, REVERSED, NOT_SIGNIFICANT)
                                    if w in words)


# ---- the table ------------------------------------------------------------------------------------

def metric_sides(metric: str) -> tuple[str, str | None]:
    """(token metric, graph metric or None) of the metric asked for: `le2` and `lgeval_le2` give
    (`le2`, `lgeval_le2`), `exprate` (`exprate`, None); paper figures go by the token metric's name."""
    if metric in TOKEN_METRIC:
        return TOKEN_METRIC[metric], metric
    return metric, ON_GRAPHS.get(metric)


@dataclass(frozen=True)
class _Study:
    """A claim at one budget as the store holds it."""

    claim: Claim
    budget: str
    name: str
    comparisons: tuple[tuple[str, str], ...]
    runs: pd.DataFrame
    good: pd.DataFrame  # the runs that count (scored, not failed or pruned)
    progress: str | None

    @property
    def answers(self) -> bool:
        return not self.good.empty and not self.progress


def claims_table(budgets: str | Sequence[str] = DEFAULT_BUDGETS, tracking_uri: str | None = None, *,
                 metric: str = "exprate", claims: Sequence[Claim] = CLAIMS,
                 n_resamples: int = DEFAULT_RESAMPLES) -> pd.DataFrame:
    """One row per claim, budget, comparison and test year; `budgets` a name, "a,b" or a sequence.
    `attrs`: `metric` (the one shown), `token_metric`, `lacking`."""
    uri = resolve_tracking_uri(tracking_uri)
    names = [b.strip() for b in budgets.split(",")] if isinstance(budgets, str) else list(budgets)
    token, graph = metric_sides(metric)
    studies = [study for i, budget in enumerate(names) for study in _studies(budget, uri, claims, first=i == 0)]
    lacking = [s.name for s in studies if graph and s.answers and not _carries(s.good, graph)]
    shown = graph if graph and not lacking else token
    rows = [row for s in studies for row in _study_rows(s, uri, shown, token, n_resamples)]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update({"budgets": names, "metric": shown, "token_metric": token, "lacking": lacking,
                     "n_resamples": n_resamples, "claims": list(claims)})
    return df


def _studies(budget: str, uri: str, claims: Sequence[Claim], first: bool) -> list[_Study]:
    """Every claim's study at one budget; after the `first`, only those the store has, with the
    comparisons of the variants they train (the long studies train two each)."""
    studies = []
    for claim in claims:
        study = claim.study_name(budget)
        comparisons = claim.comparisons
        if not first:
            parent = study_parent(study, uri)
            if parent is None:
                continue
            trained = set(grid_order(parent))
            comparisons = tuple((w, lo) for w, lo in comparisons if w in trained and lo in trained)
        runs = load_runs(uri, study=study)
        studies.append(_Study(claim, budget, study, comparisons, runs, runs[scored(runs)], study_progress(study, uri)))
    return studies


def _carries(runs: pd.DataFrame, metric: str) -> bool:
    """Whether each run has `metric` on every test year it was scored on."""
    for year in scored_years(runs):
        scored_on = runs[f"metrics.test_{year}_exprate"].notna()
        column = f"metrics.test_{year}_{metric}"
        if scored_on.any() and (column not in runs.columns or runs.loc[scored_on, column].isna().any()):
            return False
    return True


def _study_rows(s: _Study, uri: str, metric: str, token: str, n_resamples: int) -> list[dict[str, Any]]:
    if not s.answers:
        # a row per year the paper gives figures for (one, year empty, without any)
        figures = _figures()
        paper_years = sorted(set(figures.loc[figures["claim"] == s.claim.name, "year"])) or [""]
        return [_empty_row(s, winner, loser, y, metric, token, s.progress or NO_STUDY)
                for winner, loser in s.comparisons for y in paper_years]
    rows: list[dict[str, Any]] = []
    years = scored_years(s.runs)
    load = cache(lambda run_id, year: load_predictions(run_id, year, uri))  # each artifact once across comparisons
    for winner, loser in s.comparisons:
        absent = [v for v in (winner, loser) if v not in set(s.good["variant"])]
        if absent:
            word = f"no runs of {' and '.join(absent)}"
            rows += [_empty_row(s, winner, loser, y, metric, token, word) for y in years]
            continue
        pair = s.runs[s.runs["variant"].isin([winner, loser])]
        table = variant_table(pair, baseline=loser, years=years, predictions=load, metric=metric,
                              n_resamples=n_resamples, title=s.name)
        won, lost = table.loc[winner], table.loc[loser]
        for year in years:
            row = _empty_row(s, winner, loser, year, metric, token, "")
            cells = {k: won.get(f"{year}_{k}") for k in ("delta", "delta_low", "delta_high", "p_bootstrap",
                                                           "p_sign_flip", "p_mcnemar")}
            row.update(cells)
            # the table's sides: 1 the variant (the claimed winner), -1 the baseline (the loser)
            side = {1: winner, -1: loser, 0: ""}
            flip_favours = won.get(f"{year}_sign_flip_favours")
            flip_favours = 0 if is_missing(flip_favours) else int(flip_favours)
            pair_ps, pair_favours = (won.get(f"{year}_{k}") for k in ("p_mcnemar_pairs", "mcnemar_favours"))
            pair_ps, pair_favours = (v if isinstance(v, tuple) else () for v in (pair_ps, pair_favours))
            row.update({
                "seeds_winner": int(won["seeds"]), "seeds_loser": int(lost["seeds"]),
                **{f"{name}{part}_{stat}": side_row.get(f"{year}_{m}_{stat}")
                   for name, side_row in (("winner", won), ("loser", lost))
                   for part, m in (("", metric), ("_token", token)) for stat in ("mean", "std")},
                "sign_flip_favours": math.nan if is_missing(cells["p_sign_flip"]) else side[flip_favours],
                "verdict": verdict(cells["p_sign_flip"], flip_favours),
                "p_mcnemar_pairs": pair_ps or math.nan,
                "mcnemar_favours": tuple(side[int(f)] for f in pair_favours) or math.nan,
                "verdict_mcnemar": verdict_per_seed(pair_ps, pair_favours),
            })
            rows.append(row)
    return rows


def _empty_row(s: _Study, winner: str, loser: str, year: str, metric: str, token: str, word: str) -> dict[str, Any]:
    """A row with the claim and the paper's figures, measuring nothing."""
    name = s.claim.name
    return {**dict.fromkeys(COLUMNS, math.nan), "claim": name, "budget": s.budget, "study": s.name, "winner": winner,
            "loser": loser, "year": year, "metric": metric, "verdict": word, "verdict_mcnemar": word,
            "paper_winner": paper_figure(name, winner, year, token) if year else math.nan,
            "paper_loser": paper_figure(name, loser, year, token) if year else math.nan}


# printed under a table on token edits: a paper's (lgeval) figure there is context, never a target
EDIT_METRICS_DIFFER = (
    "Within one / two errors: the papers' figures (lgeval) count errors in the symbol label graph (symbols, "
    "relations and segmentation) as the official CROHME tools do; ours count token edits (Levenshtein over the "
    "LaTeX tokens). They are different metrics: on the same 2014 predictions (run 7ef3f758 of cpu-best, "
    "the previous best CPU model) the official pipeline read 26.57 / 31.64 % within one / two graph errors "
    "where the token metric reads 28.30 / 36.71 % (their ExpRates agree). The verdicts compare our runs on "
    "the token metric only.")
# ... and under one on the papers' metric
ON_THE_PAPERS_METRIC = (
    "Within one / two errors, on the papers' metric: ours (lgeval) count errors in the symbol label graph as "
    "the official CROHME tools do (hmer.evaluation.lgeval, which gives their figures expression for expression), "
    "the metric of the papers' figures; Δ and both tests are on it, over the expressions whose truth converts "
    "to a graph. Ours (tokens) are the suite's own metric, token edits (Levenshtein over the LaTeX tokens), on "
    "the same runs: it reads a few points higher (run 7ef3f758 of cpu-best, 2014: 28.30 / 36.71 % within one / "
    "two token edits, 26.57 / 31.64 % within one / two graph errors).")


def format_claims(df: pd.DataFrame, fmt: str = "text", *, sources: bool = True) -> str:
    """The claims table, the claims and the figures' sources; `sources=False` (a further metric under
    the first) without the claims and sources."""
    render = layout(fmt)
    strong = bold(fmt)
    metric = df.attrs.get("metric", "exprate")
    token = df.attrs.get("token_metric", metric)
    label = metric_label(token)
    on_graphs = metric != token  # ours on the papers' metric, our token metric kept beside it
    paper_label, ours_label = (label, label) if token == "exprate" and not on_graphs else (
        f"{label} lgeval", f"{label} lgeval" if on_graphs else f"{label} tokens")
    kept = [f"ours {label} tokens (winner)", f"ours {label} tokens (loser)"] if on_graphs else []
    head = ["claim", "budget", "year", "claimed", f"paper {paper_label}", f"ours {ours_label} (winner)",
            f"ours {ours_label} (loser)", *kept, f"Δ {ours_label} [{DEFAULT_CONFIDENCE:.0%} CI]", "p boot",
            "p all seeds", "verdict, all seeds", "p McNemar per seed pair", "verdict, per-seed McNemar"]
    body = []
    for _, r in df.iterrows():
        paper = (MISSING if is_missing(r["paper_winner"]) and is_missing(r["paper_loser"])
                 else f"{number(r['paper_winner'], 2)} / {number(r['paper_loser'], 2)}")
        delta = difference(r["delta"], r["delta_low"], r["delta_high"])
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
             f"with its paired-bootstrap interval and p (p boot). Two tests, each with its verdict at α = {ALPHA:g}: "
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
    figures = _figures()
    cited = []
    for (claim, variant), part in figures.groupby(["claim", "variant"], sort=False):
        where = "; ".join(f"{', '.join(metric_label(m) for m in sub['metric'].unique())} from {source}"
                          for source, sub in part.groupby("source", sort=False))
        cited.append(f"- {claim}, {variant}: {part.iloc[0]['paper']}. {where}. Note: {part.iloc[0]['note']}.")
    paper_note = (f"Paper {paper_label} = the paper's figure for the claimed winner / loser; {MISSING} where it was "
                  "not found in a source that can be cited:")
    blocks = ([intro, render(head, body), "Claims:\n" + "\n".join(notes), paper_note + "\n" + "\n".join(cited)]
              if sources else
              [f"{strong('The same claims, ' + ours_label)}: columns, tests and verdicts as in the first table, "
               f"on this metric.", render(head, body)])
    if on_graphs:
        blocks.append(ON_THE_PAPERS_METRIC)
    elif token != "exprate":
        blocks.append(EDIT_METRICS_DIFFER)
    lacking = df.attrs.get("lacking") or []
    if lacking:
        blocks.append(f"Ours are on token edits because the runs of {', '.join(lacking)} do not carry the papers' "
                      f"metric (they were trained before it was registered): `hmer runs rescore` gives it to them "
                      f"from their stored predictions, and the table is then on it.")
    return "\n\n".join(blocks) + "\n"


def _sided_p(p: Any, favours: Any, row: pd.Series) -> str:
    """"+0.003" favouring the claimed winner, "-0.003" the loser."""
    if is_missing(p):
        return MISSING
    sign = "+" if favours == row["winner"] else "-" if favours == row["loser"] else ""
    return f"{sign}{p_value(p)}"


def _ours(row: pd.Series, side: str, suffix: str = "") -> str:
    """One side's mean ± std (seeds); `suffix="_token"` on our token metric."""
    mean = row[f"{side}{suffix}_mean"]
    if is_missing(mean):
        return MISSING
    return f"{mean_pm_std(mean, row[f'{side}{suffix}_std'])} ({int(row[f'seeds_{side}'])})"
