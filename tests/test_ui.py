"""The web UIs a user opens on a store, in a real browser (issue 28): `mlflow ui` opens a study's
experiment as model training, its parent run shows the study's table, its chart view compares the
variants, and optuna-dashboard lists the study and its trials.

Against two stores: the one a real smoke study makes (tests/study_store.py, shared with the report
tests) and a copy of the committed store in mlruns/, served from a folder laid out as a clone.
With HMER_SCREENSHOTS=docs the committed store's pages are saved as the README's pictures.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from browser import chromium, mlflow_ui, optuna_dashboard, require_browser, screenshot
from hmer.reports.runs import load_runs, study_parent
from hmer.reports.study_run import summary_metric
from hmer.reports.table_format import format_table
from hmer.reports.tables import grid_order, variant_table
from hmer.tracking import keys
from hmer.tracking.ui import ui_url
from study_store import study_store

REPO = Path(__file__).resolve().parents[1]
COMMITTED_STUDY = "ablate_direction-cpu"
LOAD_TIMEOUT_MS = 60_000  # the first page of a cold `mlflow ui` on a busy 2-core machine

pytestmark = pytest.mark.slow


@dataclass
class Site:
    """One store served by both UIs, and what the tests expect to find there."""

    name: str  # "smoke" or "committed"
    tracking_uri: str
    study: str
    experiment_id: str
    parent_run_id: str
    mlflow: str  # http://127.0.0.1:PORT of `mlflow ui`
    dashboard: str  # http://127.0.0.1:PORT of optuna-dashboard
    storage: str

    def port(self) -> int:
        return int(self.mlflow.rsplit(":", 1)[1])


def _serve(name: str, tmp_path_factory) -> tuple[str, str, str, Path]:
    """(tracking URI, Optuna storage, study, folder to serve from) of the store `name`."""
    if name == "smoke":
        store = study_store(tmp_path_factory.getbasetemp() / "report-study-store")
        return store.tracking_uri, store.storage, store.study, store.root
    if not (REPO / "mlruns" / "mlflow.db").is_file():
        pytest.skip("no committed store in mlruns/")
    clone = tmp_path_factory.mktemp("ui-clone")
    shutil.copytree(REPO / "mlruns", clone / "mlruns", ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    # as the README has users run it from a checkout: relative paths, resolved in the clone
    return "sqlite:///mlruns/mlflow.db", "sqlite:///mlruns/optuna.db", COMMITTED_STUDY, clone


@pytest.fixture(scope="module", params=["smoke", "committed"])
def site(request, tmp_path_factory):
    require_browser()
    uri, storage, study, folder = _serve(request.param, tmp_path_factory)
    absolute_uri = uri if uri.startswith("sqlite:////") else f"sqlite:///{folder / uri[len('sqlite:///'):]}"
    client = MlflowClient(absolute_uri)
    experiment = client.get_experiment_by_name(study)
    assert experiment is not None, f"no experiment {study} in {absolute_uri}"
    parent = study_parent(study, absolute_uri)
    assert parent is not None, f"study {study} has no parent run"
    absolute_storage = storage if storage.startswith("sqlite:////") else \
        f"sqlite:///{folder / storage[len('sqlite:///'):]}"
    logs = tmp_path_factory.mktemp(f"ui-logs-{request.param}")
    with mlflow_ui(uri, folder, logs) as mlflow_base, optuna_dashboard(absolute_storage, logs) as dashboard:
        yield Site(name=request.param, tracking_uri=absolute_uri, study=study,
                   experiment_id=experiment.experiment_id, parent_run_id=str(parent["run_id"]),
                   mlflow=mlflow_base, dashboard=dashboard, storage=absolute_storage)


@pytest.fixture(scope="module")
def browser():
    with chromium() as opened:
        yield opened


@pytest.fixture(scope="module")
def page(browser, site):
    """One tab per store, in a fresh profile: MLflow's app loads once (tens of seconds of JavaScript
    on a busy core), then each test moves within it by URL, as a user following links does."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(LOAD_TIMEOUT_MS)
    yield opened
    context.close()


def _close_assistant(page) -> None:
    """Hide MLflow's assistant side panel, which opens by default beside the runs (for the pictures)."""
    close = page.locator("button[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.first.click()


def _study_rows(site: Site) -> dict[str, list[str]]:
    """The first table `hmer report --study` prints (variant, seeds, mean ± std per year and
    measure), cell by cell, by variant label; from the child runs' metrics."""
    parent = study_parent(site.study, site.tracking_uri)
    runs = load_runs(site.tracking_uri, study=site.study)
    table = variant_table(runs, baseline=json.loads(parent["params.baseline"]), order=grid_order(parent),
                          title=site.study)
    text = format_table(table, "text").split("\n\n")[1]  # the title, then the scores block
    rows = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[2:]]
    return {row[0]: row for row in rows}


def _shown(locator, timeout_ms: int = 30_000) -> int:
    """How many elements `locator` matches once the first has appeared (0 if none does within the
    timeout): the single-page app renders rows and charts after its first text, so a count taken at
    once can miss what is about to be drawn."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.first.wait_for(state="attached", timeout=timeout_ms)
    except PlaywrightTimeout:
        return 0
    return locator.count()


def test_the_link_opens_the_study_as_model_training(site, page):
    # what the UI's own API answers about the experiment: MLflow's record of its kind
    answer = page.request.get(f"{site.mlflow}/ajax-api/2.0/mlflow/experiments/get?experiment_id={site.experiment_id}")
    tags = {t["key"]: t["value"] for t in answer.json()["experiment"].get("tags", [])}
    assert tags.get(keys.MLFLOW_EXPERIMENT_KIND) == keys.EXPERIMENT_KIND_TRAINING, \
        f"experiment {site.study} is not tagged as model training: {tags}"

    page.goto(ui_url(site.experiment_id, charts=False, port=site.port()))
    page.get_by_text(re.compile(r"\d+ matching runs")).wait_for()
    assert f"/experiments/{site.experiment_id}/runs" in page.url and "workflowType=machine_learning" in page.url
    assert _shown(page.get_by_role("link", name=site.study, exact=True)) >= 1, \
        f"the runs page shows no row of {site.study}"  # the parent run's row
    assert not page.get_by_text("No data available for the selected time range").count()  # GenAI's overview
    if site.name == "committed":
        _close_assistant(page)
        screenshot(page, "ui_mlflow_runs")


def test_the_experiment_list_opens_the_study_as_model_training_once_chosen(site, browser):
    """The other way in that the README gives: in a fresh browser, choose "Model training" at the top
    left once, and choosing the study in the experiment list opens its training runs, in this tab and
    in the next (the browser keeps the choice). MLflow 3.17 does not read the experiment's tag there:
    without that choice, the list opens the GenAI overview (docs/studies.md)."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1600, "height": 1000})

    def experiment_list():
        tab = context.new_page()
        tab.set_default_timeout(LOAD_TIMEOUT_MS)
        tab.goto(f"{site.mlflow}/#/experiments")
        tab.get_by_role("link", name=site.study, exact=True).first.wait_for()
        return tab

    def choose_the_study(tab):
        tab.get_by_role("link", name=site.study, exact=True).first.click()
        # the experiment page redirects to its default tab once it has loaded: runs, or GenAI's overview
        expect(tab).to_have_url(re.compile(rf"/experiments/{site.experiment_id}/runs\b"), timeout=LOAD_TIMEOUT_MS)
        tab.get_by_text(re.compile(r"\d+ matching runs")).wait_for()

    try:
        first = experiment_list()
        first.get_by_text("Model training", exact=True).first.click()
        choose_the_study(first)
        choose_the_study(experiment_list())
    finally:
        context.close()


def test_the_parent_run_shows_the_study_table(site, page):
    expected = _study_rows(site)
    page.goto(f"{site.mlflow}/#/experiments/{site.experiment_id}/runs/{site.parent_run_id}"
              f"?workflowType=machine_learning")
    page.get_by_text("Description").first.wait_for()
    description = page.locator("table", has_text="2014 ExpRate")
    assert _shown(description) >= 1, f"the parent run of {site.study} shows no table in its description"
    shown = {}
    for line in description.first.inner_text().splitlines()[1:]:
        cells = [c.strip() for c in line.split("\t")]
        shown[cells[0]] = cells
    assert shown == expected, f"the description's table differs from hmer report's:\n{shown}\n{expected}"
    if site.name == "committed":
        _close_assistant(page)
        more = page.get_by_text("Show more", exact=True)
        if more.count():
            more.first.click()
        page.get_by_text("Description").first.evaluate("e => e.scrollIntoView({block: 'start'})")
        screenshot(page, "ui_mlflow_parent_run")


def test_the_chart_view_compares_the_variants(site, page):
    variants = [label.removesuffix(" (baseline)") for label in _study_rows(site)]
    page.goto(ui_url(site.experiment_id, port=site.port()))
    page.get_by_text(re.compile(r"\d+ matching runs")).wait_for()
    # Sections below the first are drawn only when scrolled to, and which metrics come first depends
    # on the store (2014-std sorts before 2014): the chart view's own search brings each one up.
    search = page.get_by_placeholder(re.compile("search", re.I)).last
    for variant in variants:
        name = summary_metric("2014", "mean", variant)
        search.fill(name)
        assert _shown(page.get_by_text(name, exact=True)) >= 1, f"no chart of {name} in the chart view"
    for year in ("2016", "2019"):
        for stat in ("mean", "std") if site.name == "committed" else ("mean",):  # one seed: no std
            section = summary_metric(year, stat, variants[0]).split("/")[0]
            search.fill(section)
            assert _shown(page.get_by_text(section, exact=True)) >= 1, f"no section {section} in the chart view"
    if site.name == "committed":  # the picture: the variants' charts of the headline metric
        headline = summary_metric("2014", "mean", variants[0]).split("/")[0]
        search.fill(headline)
        page.get_by_text(f"{headline}/{variants[-1]}", exact=True).first.wait_for()
        page.wait_for_timeout(1500)  # the search's spinner and the bars settle after the titles
        _close_assistant(page)
        screenshot(page, "ui_mlflow_charts")
    search.fill("")


def test_optuna_dashboard_lists_the_study_and_its_trials(site, page):
    trials = optuna.load_study(study_name=site.study, storage=site.storage).trials
    page.goto(f"{site.dashboard}/dashboard/")
    page.get_by_text(site.study).first.click()
    page.get_by_text(f"{site.study} (id=").first.wait_for()
    if site.name == "committed":
        page.wait_for_timeout(1500)  # the history plot draws after the page
        screenshot(page, "ui_optuna_dashboard")
    page.goto(page.url.split("?")[0].rstrip("/") + "/trials")
    page.get_by_text(f"{len(trials)} Trials", exact=True).wait_for()
    for trial in trials:
        assert _shown(page.get_by_text(f"Trial {trial.number}", exact=True)) >= 1
