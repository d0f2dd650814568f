"""The web UIs a user opens on a store, in a real browser (issues 28 and 49).

`hmer ui` starts `mlflow ui` and optuna-dashboard and prints each study's links. The MLflow link
opens the study's comparison as model training: its runs flat (the variants' summary runs first,
then the trials), and in the chart view one chart per test year, the years first, with a bar per
variant at its mean ExpRate. The parent run shows the study's figure and its table. optuna-dashboard
names the objective and shows the study's note, and each failed trial's note names the trial that
took it over. Serving writes nothing to the store, and Ctrl-C stops both servers.

Against two stores: the smoke study's (tests/study_store.py, a real study run in this session),
served in place with `--store`, and the committed store in mlruns/, served as a user's `hmer ui`
serves it, from a copy. With HMER_SCREENSHOTS=docs the committed store's pages are saved as the
pictures of the README and docs/studies.md.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from browser import chromium, require_browser, screenshot
from hmer.reports.runs import list_studies, load_runs, study_parent
from hmer.store.study_run import FIGURE_WIDTH_PX, summary_metric, summary_run_name
from hmer.reports.tables import format_table
from hmer.reports.tables import grid_order, variant_table
from hmer.studies.grid import Grid
from hmer.tracking import keys
from hmer.tracking.ui import run_url
from servers import free_port
from study_store import study_store

REPO = Path(__file__).resolve().parents[1]
COMMITTED_STUDY = "ablate_direction-cpu"
LOAD_TIMEOUT_MS = 60_000  # the first page of a cold `mlflow ui` on a busy 2-core machine
START_TIMEOUT_S = 420.0  # `hmer ui` until both servers answer and every study's link is printed
STOP_TIMEOUT_S = 60.0

pytestmark = pytest.mark.slow


@dataclass
class Site:
    """`hmer ui` serving one store, what it printed, and what the tests expect to find there."""

    name: str  # "smoke" or "committed"
    process: subprocess.Popen
    output: Path
    store: Path  # the store's folder, whose files serving must leave as they were
    before: dict[str, str]  # their digests before `hmer ui` started
    study: str
    tracking_uri: str  # the MLflow database the UI serves (the copy's, for the committed store)
    storage: str
    mlflow: str  # http://127.0.0.1:PORT of `mlflow ui`
    dashboard: str  # http://127.0.0.1:PORT of optuna-dashboard
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # {study: {"MLflow": url, "Optuna": url}}
    copy: Path | None = None

    def printed(self) -> str:
        return self.output.read_text(errors="replace")


def _digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("mlflow.db", "optuna.db") if (folder / name).is_file()}


def _links(printed: str) -> dict[str, dict[str, str]]:
    """{study: {"MLflow": link, "Optuna": link}} from what `hmer ui` printed."""
    links: dict[str, dict[str, str]] = {}
    study = None
    for line in printed.splitlines():
        heading = re.match(r"^  (\S+) \(", line)
        if heading:
            study = heading.group(1)
            links[study] = {}
        link = re.match(r"^    (MLflow|Optuna)  (http\S+)$", line)
        if link and study:
            links[study][link.group(1)] = link.group(2)
    return links


def _start_hmer_ui(name: str, tmp_path_factory) -> tuple[list[str], Path, Path, str]:
    """(the command, its working folder, the store it serves, the study to look at)."""
    ports = ["--mlflow-port", str(free_port()), "--dashboard-port", str(free_port())]
    command = [sys.executable, "-m", "hmer.cli", "ui", *ports]
    if name == "smoke":
        store = study_store(tmp_path_factory.getbasetemp() / "report-study-store")
        return [*command, "--store", str(store.root)], store.root, store.root, store.study
    if not (REPO / "mlruns" / "mlflow.db").is_file():
        pytest.skip("no committed store in mlruns/")
    return command, REPO, REPO / "mlruns", COMMITTED_STUDY  # as a user runs it in a checkout


@pytest.fixture(scope="module", params=["smoke", "committed"])
def site(request, tmp_path_factory):
    require_browser()
    command, cwd, store, study = _start_hmer_ui(request.param, tmp_path_factory)
    output = tmp_path_factory.mktemp(f"hmer-ui-{request.param}") / "output.txt"
    before = _digests(store)
    env = {k: v for k, v in os.environ.items() if k not in ("HMER_MLRUNS", "MLFLOW_TRACKING_URI")}
    with open(output, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ctrl-C stops both." not in output.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, \
                f"hmer ui did not come up (status {process.poll()}):\n{output.read_text(errors='replace')[-4000:]}"
            time.sleep(1)
        printed = output.read_text(errors="replace")
        mlflow = re.search(r"MLflow UI\s+(http://127\.0\.0\.1:\d+)/", printed).group(1)
        dashboard = re.search(r"optuna-dashboard\s+(http://127\.0\.0\.1:\d+)/", printed).group(1)
        copy = re.search(r"served from a copy of its databases \((\S+)\)", printed)
        databases = Path(copy.group(1)) if copy else store
        yield Site(name=request.param, process=process, output=output, store=store, before=before, study=study,
                   tracking_uri=f"sqlite:///{databases / 'mlflow.db'}", storage=f"sqlite:///{databases / 'optuna.db'}",
                   mlflow=mlflow, dashboard=dashboard, links=_links(printed), copy=databases if copy else None)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


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


def _variant_table(site: Site):
    """The study's variants from its trials' metrics (`variant_table`, as `hmer report` builds it)."""
    parent = study_parent(site.study, site.tracking_uri)
    import json

    return variant_table(load_runs(site.tracking_uri, study=site.study),
                         baseline=json.loads(parent["params.baseline"]), order=grid_order(parent), title=site.study)


def _study_rows(site: Site) -> dict[str, list[str]]:
    """The first table `hmer report --study` prints (variant, seeds, mean ± std per year and
    metric), cell by cell, by variant label."""
    text = format_table(_variant_table(site), "text").split("\n\n")[1]  # the title, then the scores block
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


def _chart(page, title: str):
    """The chart view's card whose title is `title`."""
    return page.locator("[data-testid='experiment-view-compare-runs-card']", has=page.locator(f"h4[title='{title}']"))


def test_hmer_ui_prints_each_studys_links(site):
    studies = list_studies(site.tracking_uri)
    assert sorted(site.links) == sorted(studies["study"]), site.printed()
    client = MlflowClient(site.tracking_uri)
    optuna_studies = set(optuna.get_all_study_names(site.storage))
    for _, row in studies.iterrows():
        experiment = client.get_experiment_by_name(row["experiment"])
        link = site.links[row["study"]]["MLflow"]
        assert link.startswith(f"{site.mlflow}/#/experiments/{experiment.experiment_id}/runs?")
        assert "workflowType=machine_learning" in link and "compareRunsMode=CHART" in link
        if row["study"] in optuna_studies:
            assert site.links[row["study"]]["Optuna"].startswith(f"{site.dashboard}/dashboard/studies/")


def test_the_link_opens_the_studys_comparison(site, page):
    table = _variant_table(site)
    parent = study_parent(site.study, site.tracking_uri)
    # what the UI's own API answers about the experiment: MLflow's record of its kind
    answer = page.request.get(f"{site.mlflow}/ajax-api/2.0/mlflow/experiments/get?"
                              f"experiment_id={parent['experiment_id']}")
    tags = {t["key"]: t["value"] for t in answer.json()["experiment"].get("tags", [])}
    assert tags.get(keys.MLFLOW_EXPERIMENT_KIND) == keys.EXPERIMENT_KIND_TRAINING, tags

    page.goto(site.links[site.study]["MLflow"])
    page.get_by_text(re.compile(r"\d+ matching runs")).wait_for()
    assert f"/experiments/{parent['experiment_id']}/runs" in page.url and "workflowType=machine_learning" in page.url
    assert not page.get_by_text("No data available for the selected time range").count()  # GenAI's overview
    # the runs, flat: each variant's summary run, and its trials beside the parent (not folded under it)
    for variant, row in table.iterrows():
        name = summary_run_name(str(variant), int(row["seeds"]))
        assert _shown(page.get_by_role("link", name=name, exact=True)) == 1, f"no run {name!r} listed"
    trials = load_runs(site.tracking_uri, study=site.study)
    finished = trials[trials["status"] == "FINISHED"]
    assert _shown(page.get_by_role("link", name=str(finished["run_name"].iloc[0]), exact=True)) >= 1
    # a summary run per variant and the finished trials, nothing else (the committed study: 4 and 12;
    # its killed attempts, trained again, and its parent run are left out of the link)
    matching = page.get_by_text(re.compile(r"\d+ matching runs")).first.text_content()
    assert matching.strip().startswith(f"{len(table) + len(finished)} matching runs"), matching
    # the chart view: the test years' charts first, each with a bar per variant at its mean ExpRate
    years = [str(y) for y in table.attrs["years"]]
    first = page.locator("[data-testid='experiment-view-compare-runs-card'] h4").first
    first.wait_for()
    assert first.get_attribute("title") == summary_metric(years[0])
    chart = _chart(page, summary_metric("2014"))
    chart.first.wait_for()
    page.wait_for_timeout(1000)  # the bars are drawn after the card
    drawn = chart.first.text_content()
    for variant, row in table.iterrows():
        assert f"{row['2014_exprate_mean']:.2f}" in drawn, f"{variant}'s 2014 ExpRate is not in the chart: {drawn}"
    if site.name == "committed":
        _close_assistant(page)
        page.wait_for_timeout(1500)  # the charts widen into the panel's room
        screenshot(page, "ui_mlflow_charts")
        page.goto(site.links[site.study]["MLflow"].replace("compareRunsMode=CHART", "compareRunsMode=TABLE"))
        page.get_by_text(re.compile(r"\d+ matching runs")).wait_for()
        page.wait_for_timeout(1500)
        screenshot(page, "ui_mlflow_runs")


@pytest.mark.parametrize("site", ["committed"], indirect=True)  # the committed store's study
def test_the_positional_encoding_study_s_link_lists_its_summary_runs_and_finished_trials_alone(site, page):
    """ablate_posenc-cpu began `none` seed 3 three times; the link lists the cell's finished run alone
    (its killed attempts, trained again, are marked and left out), as every other cell's, beside the
    four variants' summary runs: 16 runs, and not its parent run."""
    runs = load_runs(site.tracking_uri, study="ablate_posenc-cpu")
    finished = runs[runs["status"] == "FINISHED"]
    assert len(finished) == 12
    page.goto(site.links["ablate_posenc-cpu"]["MLflow"])
    # the count is drawn before the filtered runs arrive: wait for it to settle on the study's runs
    page.get_by_text(re.compile(r"^\s*16 matching runs")).first.wait_for(timeout=60_000)
    for name in finished["run_name"].unique():  # "none seed 3" once: the finished run
        assert _shown(page.get_by_role("link", name=str(name), exact=True)) == 1, name


@pytest.mark.parametrize("site", ["committed"], indirect=True)  # the README's way in, on the committed store
def test_the_experiment_list_opens_the_study_as_model_training_once_chosen(site, browser):
    """The other way in that the README gives: in a fresh browser, choose "Model training" at the top
    left once, and choosing the study in the experiment list opens its training runs, in this tab and
    in the next (the browser keeps the choice). MLflow 3.17 does not read the experiment's tag there:
    without that choice, the list opens the GenAI overview (docs/studies.md)."""
    from playwright.sync_api import expect

    experiment_id = study_parent(site.study, site.tracking_uri)["experiment_id"]
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
        expect(tab).to_have_url(re.compile(rf"/experiments/{experiment_id}/runs\b"), timeout=LOAD_TIMEOUT_MS)
        tab.get_by_text(re.compile(r"\d+ matching runs")).wait_for()

    try:
        first = experiment_list()
        first.get_by_text("Model training", exact=True).first.click()
        choose_the_study(first)
        choose_the_study(experiment_list())
    finally:
        context.close()


def test_the_parent_run_shows_the_figure_and_the_study_table(site, page):
    expected = _study_rows(site)
    parent = study_parent(site.study, site.tracking_uri)
    page.goto(run_url(str(parent["experiment_id"]), str(parent["run_id"]), port=int(site.mlflow.rsplit(":", 1)[1])))
    page.get_by_text("Description").first.wait_for()
    description = page.locator("table", has_text="2014 ExpRate")
    assert _shown(description) >= 1, f"the parent run of {site.study} shows no table in its description"
    shown = {}
    for line in description.first.inner_text().splitlines()[1:]:
        cells = [c.strip() for c in line.split("\t")]
        shown[cells[0]] = cells
    assert shown == expected, f"the description's table differs from hmer report's:\n{shown}\n{expected}"
    figure = page.locator("img[src*='get-artifact?path=exprate.png']")
    assert _shown(figure) == 1
    page.wait_for_function("e => e.complete && e.naturalWidth > 0", arg=figure.first.element_handle())
    assert 400 <= figure.first.evaluate("e => e.naturalWidth") <= FIGURE_WIDTH_PX  # the page's width, not more
    if site.name == "committed":
        _close_assistant(page)
        more = page.get_by_text("Show more", exact=True)
        if more.count():
            more.first.click()
        page.get_by_text("Description").first.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(1000)
        screenshot(page, "ui_mlflow_parent_run")


def test_optuna_dashboard_names_the_objective_and_shows_the_note(site, page):
    study = optuna.load_study(study_name=site.study, storage=site.storage)
    link = site.links[site.study]["Optuna"]
    page.goto(link)
    page.get_by_text(f"{site.study} (id=").first.wait_for()
    assert _shown(page.get_by_text(Grid.objective_name, exact=True)) >= 1, "the objective has no name"
    if site.name == "committed":
        page.wait_for_timeout(1500)  # the history plot draws after the page
        screenshot(page, "ui_optuna_dashboard")
    page.goto(f"{link}/note")
    page.get_by_text(study.user_attrs[keys.DESCRIPTION]).first.wait_for()
    assert _shown(page.get_by_text(re.compile("Best Trial\" is the best single seed"))) == 1
    if site.name == "committed":
        screenshot(page, "ui_optuna_note")
    page.goto(f"{link}/trials")
    page.get_by_text(f"{len(study.trials)} Trials", exact=True).wait_for()
    for trial in study.trials:
        assert _shown(page.get_by_text(f"Trial {trial.number}", exact=True)) >= 1
    resumed = [t for t in study.trials if isinstance(t.user_attrs.get(keys.RESUMED_FROM), dict)]
    if resumed:  # a dead worker's trial says which trial continued its run
        successor = resumed[0]
        dead = successor.user_attrs[keys.RESUMED_FROM]["trial"]
        assert study.trials[dead].state == TrialState.FAIL
        page.get_by_text(f"Trial {dead}", exact=True).first.click()
        page.get_by_text(f"Trial {dead} (trial_id=").first.wait_for()
        assert _shown(page.get_by_text(f"Trial {successor.number} took it over")) == 1


def test_serving_left_the_store_as_it_was(site):
    """`mlflow ui` and optuna-dashboard have served every page above: the store's files keep their
    bytes (the smoke store is served in place; the committed one from a copy)."""
    assert _digests(site.store) == site.before


def _refused(port: int) -> bool:
    """Whether nothing listens on `port` of 127.0.0.1 any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_a_kill_9_of_hmer_ui_takes_both_servers_with_it(tmp_path):
    """Issue 70: a kill -9 of `hmer ui` left both servers holding their ports. Each runs under a watchdog
    (hmer.tracking.watchdog) that stops it when `hmer ui` dies, and removes the copy it served."""
    from hmer.tracking.store import open_experiment

    store = tmp_path / "store"
    store.mkdir()
    open_experiment(f"sqlite:///{store / 'mlflow.db'}", "results")
    optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="any")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    ports = {"MLflow UI": free_port(), "optuna-dashboard": free_port()}
    env = {k: v for k, v in os.environ.items() if k not in ("HMER_MLRUNS", "MLFLOW_TRACKING_URI")}
    env["TMPDIR"] = str(temporary)
    output = tmp_path / "output.txt"
    with open(output, "w") as out:
        ui = subprocess.Popen([sys.executable, "-m", "hmer.cli", "ui", "--store", str(store), "--mlflow-port",
                               str(ports["MLflow UI"]), "--dashboard-port", str(ports["optuna-dashboard"])],
                              cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ctrl-C stops both." not in output.read_text(errors="replace"):
        assert ui.poll() is None and time.monotonic() < deadline, output.read_text(errors="replace")[-4000:]
        time.sleep(1)
    printed = output.read_text(errors="replace")
    served = {name: port for name, port in ports.items() if f"127.0.0.1:{port}" in printed}
    assert "MLflow UI" in served and all(not _refused(port) for port in served.values())
    ui.kill()  # SIGKILL: no handler of its own runs
    ui.wait(timeout=60)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while not all(_refused(port) for port in served.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(_refused(port) for port in served.values()), served
    while list(temporary.glob("hmer-ui-*")) and time.monotonic() < deadline:  # (removed just before the last kill)
        time.sleep(0.5)
    assert not list(temporary.glob("hmer-ui-*"))


def test_ctrl_c_stops_both_servers(site):
    os.kill(site.process.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends it
    assert site.process.wait(timeout=STOP_TIMEOUT_S) == 0
    assert "hmer ui: stopped the MLflow UI and optuna-dashboard" in site.printed()
    for url in (f"{site.mlflow}/health", f"{site.dashboard}/dashboard/"):
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=5)
    if site.copy is not None:
        assert not site.copy.exists()  # the committed store's copy is gone with the servers
