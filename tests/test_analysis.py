"""Error analysis (alignment, buckets, token edits, two runs), validation and published figures in
the tables: hand-made predictions with known answers, predictions logged into a real MLflow store
through its public API, and the store of a real smoke study."""

from __future__ import annotations

import csv
import math
import random

import editdistance
import numpy as np
import pandas as pd
import pytest

from hmer.evaluation.metrics import Edit, align, edit_count
from hmer.reports.analysis import (ALL, NO_STRUCTURE, analyze, breakdown, compare_runs, confusions, expressions,
                                   format_breakdown, length_bucket, structures, top_confusions)
from hmer.reports.published import PAPER_OF_PRESET, format_published, _load, paper_of, published_exprate
from hmer.reports.tables import MISSING, format_table, variant_table
from study_store import STUDY_NAME, TEST_SPLITS, study_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- the alignment ----------------------------------------------------------------------------------

def test_alignment_reproduces_editdistance_and_both_sequences():
    rng = random.Random(0)
    tokens = ["x", "^", "{", "}", "\\frac", "2", "a"]
    for _ in range(2_000):
        truth = [rng.choice(tokens) for _ in range(rng.randint(0, 14))]
        pred = [rng.choice(tokens) for _ in range(rng.randint(0, 14))]
        edits = align(truth, pred)
        assert edit_count(edits) == editdistance.eval(truth, pred)
        assert [e.truth for e in edits if e.truth is not None] == truth  # nothing lost or reordered
        assert [e.prediction for e in edits if e.prediction is not None] == pred


def test_alignment_tie_breaking_is_the_documented_one():
    # Two equally short alignments of "a b" to "b a"; the diagonal wins: two substitutions.
    assert align(["a", "b"], ["b", "a"]) == [Edit("substitution", "a", "b"), Edit("substitution", "b", "a")]
    # "a" -> "b b": substitution + insertion either way round; from the end the diagonal comes first.
    assert align(["a"], ["b", "b"]) == [Edit("insertion", None, "b"), Edit("substitution", "a", "b")]
    assert align("x ^ { 2 }".split(), "x ^ 2 }".split())[2] == Edit("deletion", "{", None)
    assert align([], ["y"]) == [Edit("insertion", None, "y")] and align(["y"], []) == [Edit("deletion", "y", None)]
    assert align(["a"], ["a"]) == [Edit("match", "a", "a")]


def test_buckets_by_length_and_structure():
    assert [length_bucket(n) for n in (0, 1, 10, 11, 20, 21, 40, 41, 300)] == [
        "1-10", "1-10", "1-10", "11-20", "11-20", "21-40", "21-40", ">40", ">40"]
    assert structures("x ^ { \\frac { 1 } { 2 } }".split()) == ["\\frac", "^ or _"]  # overlapping buckets
    assert structures("a _ { n }".split()) == ["^ or _"] and structures("\\sqrt { x }".split()) == ["\\sqrt"]
    assert structures("x + 1".split()) == [NO_STRUCTURE]


# ---- a hand-made prediction set --------------------------------------------------------------------

def _predictions(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """name, truth, prediction as a run logs them; distance from editdistance, as the trainer does."""
    return pd.DataFrame([{"name": n, "truth": t, "prediction": p, "distance": editdistance.eval(t.split(), p.split())}
                         for n, t, p in rows])


HAND = [  # name, truth, prediction
    ("e1", "x + 1", "x + 1"),                                        # short, plain, right
    ("e2", "\\frac { a } { b }", "\\frac { a } { 6 }"),               # short, frac: b -> 6
    ("e3", "x ^ { 2 }", "x ^ 2 }"),                                  # short, ^: deletes {
    ("e4", "\\sqrt { x } + \\frac { 1 } { 2 }", "\\sqrt { x } + \\frac { 1 } { 2 }"),  # 11 tokens, sqrt+frac
    ("e5", " ".join(["a"] * 25), " ".join(["a"] * 24 + ["b"])),      # 21-40, plain: a -> b
    ("e6", " ".join(["x", "_", "{", "i", "}"] * 9), " ".join(["x", "_", "{", "i", "}"] * 9 + ["+"])),  # >40, _
]


def test_hand_made_breakdown_and_edits():
    rows = expressions(_predictions(HAND), "2014", "hand")
    table = breakdown(rows).set_index(["axis", "bucket"])
    assert table.loc[("all", ALL), "n"] == 6 and table.loc[("all", ALL), "exprate"] == pytest.approx(200 / 6)
    by_length = table.loc["length"]
    assert by_length["n"].to_dict() == {"1-10": 3, "11-20": 1, "21-40": 1, ">40": 1}
    assert by_length.loc["1-10", "exprate"] == pytest.approx(100 / 3) and by_length.loc["1-10", "le1"] == 100.0
    assert by_length.loc["11-20", "exprate"] == 100.0 and by_length.loc["21-40", "exprate"] == 0.0
    by_structure = table.loc["structure"]
    assert by_structure["n"].to_dict() == {"\\frac": 2, "^ or _": 2, "\\sqrt": 1, NO_STRUCTURE: 2}
    assert by_structure.loc["\\frac", "exprate"] == 50.0 and by_structure.loc["\\sqrt", "exprate"] == 100.0
    assert by_structure.loc[NO_STRUCTURE, "exprate"] == 50.0 and by_structure.loc["^ or _", "le1"] == 100.0
    assert by_length["n"].sum() == 6  # lengths partition the year; structures overlap (e4: \frac and \sqrt)
    assert by_structure["n"].sum() == 7

    edits = confusions(rows)
    counted = {(k, t, p): c for k, t, p, c in zip(edits["kind"], edits["truth"], edits["prediction"], edits["count"])}
    assert counted == {("substitution", "b", "6"): 1, ("deletion", "{", ""): 1, ("substitution", "a", "b"): 1,
                       ("insertion", "", "+"): 1}
    top = top_confusions(edits, top=1)
    assert top.groupby("kind").size().to_dict() == {"deletion": 1, "insertion": 1, "substitution": 1}
    assert list(top["kind"]) == ["substitution", "insertion", "deletion"] and (top["2014"] == 1).all()
    text = format_breakdown(breakdown(rows))
    assert "| bucket | 2014 n | 2014 ExpRate | 2014 ≤1 | 2014 ≤2 |" in text and "| has \\frac | 2 | 50.0" in text
    assert "overlap" in text


def test_empty_buckets_show_as_missing_not_zero():
    rows = expressions(_predictions(HAND[:1]), "2016", "one")
    table = breakdown(rows).set_index(["axis", "bucket"])
    assert table.loc[("length", ">40"), "n"] == 0 and math.isnan(table.loc[("length", ">40"), "exprate"])
    assert f"| length >40 | 0 | {MISSING} | {MISSING} | {MISSING} |" in format_breakdown(breakdown(rows))


def test_two_runs_compared_bucket_by_bucket():
    a = expressions(_predictions(HAND), "2014", "A")
    better = [(n, t, t) for n, t, _ in HAND[:5]] + [("e6", HAND[5][1], "x")]  # B reads e2, e3, e5; loses none of A's
    b = expressions(_predictions(better), "2014", "B")
    b.loc[b["name"] == "e4", "distance"] = 3  # ... but misses e4, which A read
    b.loc[b["name"] == "e4", "correct"] = False
    table = compare_runs(a, b).set_index(["axis", "bucket"])
    everything = table.loc[("all", ALL)]
    assert (everything["only_a"], everything["only_b"], everything["both"], everything["neither"]) == (1, 3, 1, 1)
    assert everything["delta"] == pytest.approx(100 * (4 - 2) / 6)
    assert table.loc[("length", "11-20"), "only_a"] == 1 and table.loc[("length", "11-20"), "delta"] == -100.0
    assert table.loc[("structure", "\\frac"), "only_b"] == 1 and table.loc[("structure", "\\frac"), "only_a"] == 1
    result = analyze(a, b)
    assert result.labels == ("A", "B") and "only A" in result.markdown() and "Δ (B − A)" in result.markdown()
    with pytest.raises(ValueError, match="one run per side"):
        compare_runs(pd.concat([a, a]), b)


# ---- predictions logged into a real store ------------------------------------------------------------

def _log_run(tmp_path, client, experiment_id: str, name: str, years: dict[str, list[tuple[str, str, str]]]) -> str:
    run_id = client.create_run(experiment_id, run_name=name, tags={"hmer.variant": name}).info.run_id
    folder = tmp_path / f"{name}-predictions"
    folder.mkdir()
    for year, rows in years.items():
        with open(folder / f"test_{year}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "truth", "prediction", "distance"])
            for n, t, p in rows:
                writer.writerow([n, t, p, editdistance.eval(t.split(), p.split())])
        client.log_metric(run_id, f"test_{year}_exprate", 100.0 * np.mean([t == p for _, t, p in rows]))
    client.log_artifacts(run_id, str(folder), "predictions")
    client.set_terminated(run_id)
    return run_id


@pytest.fixture
def logged(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("analysis", artifact_location=(tmp_path / "artifacts").as_uri())
    a = _log_run(tmp_path, client, experiment_id, "a", {"2014": HAND, "2016": HAND[:3]})
    b = _log_run(tmp_path, client, experiment_id, "b", {"2014": [(n, t, t) for n, t, _ in HAND], "2016": HAND[:3]})
    empty = client.create_run(experiment_id, run_name="no-predictions").info.run_id
    return uri, a, b, empty


def test_hmer_analyze_one_run_tables_files_and_csv(logged, tmp_path, capsys):
    from hmer.cli import main

    uri, a, _, _ = logged
    out = tmp_path / "analysis"
    assert main(["analyze", a, "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"**a ({a[:8]})**" in printed and "| has \\frac | 2 | 50.0" in printed and "| 2016 n |" in printed
    assert "| substitution | b | 6 | 2 | 1 | 1 |" in printed  # counts: all years, then 2014, 2016
    for name in ("analysis.md", "breakdown.csv", "confusions.csv"):
        assert (out / name).is_file()
    assert (out / "analysis.png").read_bytes()[:8] == PNG_MAGIC
    table = pd.read_csv(out / "breakdown.csv", dtype={"year": str})
    for year, size in (("2014", 6), ("2016", 3)):
        part = table[table["year"] == year]
        assert part.loc[part["axis"] == "length", "n"].sum() == size == part.loc[part["axis"] == "all", "n"].item()
    assert main(["analyze", a, "--tracking-uri", uri, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "label,year,axis,bucket,n,runs,exprate,le1,le2" and len(lines) == 1 + 2 * 9


def test_hmer_analyze_two_runs(logged, tmp_path, capsys):
    from hmer.cli import main

    uri, a, b, _ = logged
    assert main(["analyze", a, b, "--tracking-uri", uri, "--out", str(tmp_path / "ab")]) == 0
    printed = capsys.readouterr().out
    assert f"A = **a ({a[:8]})**, B = **b ({b[:8]})**" in printed
    assert "| 2014 | all | 6 | 33.3 | 100.0 | +66.7 | 0 | 4 | 2 | 0 |" in printed
    assert "| 2016 | all | 3 | 33.3 | 33.3 | +0.0 | 0 | 0 | 1 | 2 |" in printed
    comparison = pd.read_csv(tmp_path / "ab" / "comparison.csv")
    assert set(comparison["year"]) == {2014, 2016}


def test_hmer_analyze_bad_runs_give_one_line_and_status_2(logged, capsys):
    from hmer.cli import main

    uri, a, _, empty = logged
    assert main(["analyze", "0" * 32, "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hmer: error: no run '" + "0" * 32 + "'")
    assert main(["analyze", empty, "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no predictions/test_<year>.csv" in err[0]
    assert main(["analyze", a, a, a, "--tracking-uri", uri]) == 2
    assert "not 3" in capsys.readouterr().err


# ---- published figures and validation in the tables ---------------------------------------------------

def test_published_figures_carry_their_sources():
    table = _load()
    assert published_exprate("BTTR") == {"2014": 53.96, "2016": 52.31, "2019": 52.96}
    assert published_exprate("CoMER") == {"2014": 59.33, "2016": 59.81, "2019": 62.97}
    assert (table["paper"] != "").all() and (table["venue"] != "").all() and (table["source"] != "").all()
    assert set(PAPER_OF_PRESET.values()) <= set(table["model"])
    assert not any(p.startswith("tiny") for p in PAPER_OF_PRESET)
    text = format_published()
    assert "not measured here" in text and "53.96" in text and "arXiv:2207.04410" in text


def test_hmer_report_published_prints_the_table_alone(capsys):
    from hmer.cli import main

    assert main(["report", "--published"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Published ExpRate (%)") and "59.81" in out
    assert main(["report", "--published", "--study", "x"]) == 2


def _runs(rows: list[dict]) -> pd.DataFrame:
    """A load_runs-like frame with params.name, model params, test and validation metrics."""
    from hmer.model_presets import preset_with_recipe

    out = []
    for i, r in enumerate(rows):
        row = {"run_id": f"run{i}", "variant": r["variant"], "seed": i, "trial": i, "state": "finished",
               "params.name": r["preset"]}
        if r["preset"] in PAPER_OF_PRESET or r["preset"].startswith("tiny"):
            row.update({f"params.model.{k}": v for k, v in vars(preset_with_recipe(r["preset"]).model).items()})
        row.update({f"params.model.{k}": v for k, v in r.get("model", {}).items()})
        for year, score in r["scores"].items():
            row.update({f"metrics.test_{year}_exprate": score, f"metrics.test_{year}_n": 986})
        row.update({f"metrics.{k}": v for k, v in r.get("metrics", {}).items()})
        out.append(row)
    return pd.DataFrame(out)


def test_a_variant_is_a_papers_model_only_with_the_papers_model_fields():
    assert paper_of(_runs([{"variant": "b", "preset": "bttr", "scores": {}}])) == "BTTR"
    assert paper_of(_runs([{"variant": "c", "preset": "comer-fusion", "scores": {}}])) == "CoMER"
    assert paper_of(_runs([{"variant": "c", "preset": "comer-fusion", "model": {"coverage": "none"},
                            "scores": {}}])) is None  # an ablation cell: not CoMER any more
    assert paper_of(_runs([{"variant": "t", "preset": "tiny-comer", "scores": {}}])) is None
    assert paper_of(_runs([{"variant": "w", "preset": "wap-rnn", "scores": {}}])) is None


def test_tables_show_validation_and_published_figures_and_never_zero_for_missing():
    runs = _runs([
        {"variant": "bttr", "preset": "bttr", "scores": {"2014": 50.0, "2016": 48.0},
         "metrics": {"val_final_exprate": 55.0, "val_final_le1": 66.0, "val_final_le2": 70.0, "val_final_n": 400,
                     "best_val_exprate": 52.0, "val_exprate": 51.0}},
        {"variant": "bttr", "preset": "bttr", "scores": {"2014": 52.0, "2016": 50.0},
         "metrics": {"val_final_exprate": 57.0, "val_final_le1": 68.0, "val_final_le2": 72.0, "val_final_n": 400,
                     "best_val_exprate": 54.0, "val_exprate": 53.0}},
        # no validation split: best_val_exprate is logged as 0 and there is no val_exprate curve
        {"variant": "tiny", "preset": "tiny-comer", "scores": {"2014": 1.0, "2016": 2.0},
         "metrics": {"best_val_exprate": 0.0}},
    ])
    df = variant_table(runs, title="val")
    assert df.loc["bttr", "val_exprate_mean"] == 56.0 and df.loc["bttr", "val_n"] == 400
    assert df.loc["bttr", "best_val_exprate_mean"] == 53.0
    assert math.isnan(df.loc["tiny", "val_exprate_mean"]) and math.isnan(df.loc["tiny", "best_val_exprate_mean"])
    assert df.loc["bttr", "paper"] == "BTTR" and df.loc["bttr", "2014_published"] == 53.96
    assert df.loc["tiny", "paper"] == "" and math.isnan(df.loc["tiny", "2016_published"])
    text = format_table(df)
    assert "Validation beside the test years" in text and "56.0 ± 1.4" in text and "53.0 ± 1.4" in text
    validation = text.split("Validation beside the test years")[1].split("Published beside measured")[0]
    tiny_row = next(line for line in validation.splitlines() if line.startswith("tiny"))
    assert tiny_row.split()[1:6] == [MISSING] * 5  # no validation: "–", never 0
    published = text.split("Published beside measured")[1]
    assert "53.96" in published and "-3.0" in published  # 2014: 51.0 measured - 53.96 published
    assert "tiny" not in published.split("Test expressions")[0]


def test_tables_without_validation_or_papers_add_nothing():
    runs = _runs([{"variant": "x", "preset": "wap-rnn", "scores": {"2014": 10.0}}])
    text = format_table(variant_table(runs))
    assert "Validation beside" not in text and "Published beside" not in text


# ---- on the store of a real smoke study ------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return study_store(tmp_path_factory.getbasetemp() / "report-study-store")


@pytest.mark.slow
def test_analysis_of_a_trained_run_counts_every_expression_once_per_axis(store):
    from hmer.reports import load_runs
    from hmer.reports.analysis import run_expressions

    run_id = load_runs(store.tracking_uri, study=store.study)["run_id"][0]
    rows = run_expressions(run_id, store.tracking_uri)
    table = breakdown(rows)
    for year in ("2014", "2016", "2019"):
        part, size = table[table["year"] == year], TEST_SPLITS[year]
        assert part.loc[part["axis"] == "all", "n"].item() == size
        assert part.loc[part["axis"] == "length", "n"].sum() == size
        structured = rows[(rows["year"] == year) & rows["structures"].map(lambda s: s != [NO_STRUCTURE])]
        none = part.loc[(part["axis"] == "structure") & (part["bucket"] == NO_STRUCTURE), "n"].item()
        assert none + len(structured) == size
        assert part.loc[part["axis"] == "all", "exprate"].item() == pytest.approx(
            load_runs(store.tracking_uri, run_ids=[run_id])[f"metrics.test_{year}_exprate"].item())
    assert (rows["distance"] == [editdistance.eval(t, p) for t, p in zip(rows["truth"], rows["prediction"])]).all()


@pytest.mark.slow
def test_hmer_report_with_analysis(store, tmp_path, capsys):
    from hmer.cli import main

    out = tmp_path / "report"
    assert main(["report", "--study", store.study, "--tracking-uri", store.tracking_uri, "--out", str(out),
                 "--analysis"]) == 0
    printed = capsys.readouterr().out
    assert "by target length and structure" in printed and "Validation beside the test years" in printed
    assert (out / "analysis" / "analysis.png").read_bytes()[:8] == PNG_MAGIC
    assert "analysis/analysis.md" in (out / "table.md").read_text()
    table = pd.read_csv(out / "analysis" / "breakdown.csv", dtype={"year": str})
    assert set(table["label"]) == {"none", "cross"} and STUDY_NAME in (out / "analysis" / "analysis.md").read_text()


def test_validation_cells_tolerate_any_missing_metric_column():
    runs = _runs([{"variant": "x", "preset": "wap-rnn", "scores": {"2014": 10.0}, "metrics": {"val_exprate": 5.0}}])
    df = variant_table(runs)
    assert math.isnan(df.loc["x", "best_val_exprate_mean"]) and math.isnan(df.loc["x", "val_n"])
    assert "Validation beside" not in format_table(df)
