"""Every tag, attribute and param key the suite writes into MLflow and Optuna, named once.

The strings are part of the stored records (committed stores, studies resumed across versions), so
a value never changes once released; rename the constant instead. `hmer.` prefixes the suite's keys,
`mlflow.` MLflow's reserved tags.
"""


PREFIX = "hmer."  # the prefix of every key of this project below


def trial_score(metric: str) -> str:
    """The trial user attribute that holds a test score, the run's metric `metric` (`test_2014_exprate`)."""
    return PREFIX + metric


# ---- MLflow tags on every training run ----------------------------------------------------------
VARIANT = "hmer.variant"          # the run's variant label (config name or decoder), or a study's spec
STATUS = "hmer.status"            # running | finished | failed | pruned | paused | killed | interrupted | incomplete
ERROR = "hmer.error"              # one line: why a run or trial failed
GIT_COMMIT = "hmer.git_commit"    # the commit that produced the run, "-dirty" with uncommitted changes
FINGERPRINT = "hmer.fingerprint"  # what its training code computes (hmer.training.fingerprint), or "unknown: why"
FINGERPRINT_CHANGED = "hmer.fingerprint_changed"  # "epoch N: <fingerprint>" where a resume ran other code
DEVICE = "hmer.device"            # the devices it trained on, in words, in the order first used
DEVICE_SEPARATOR = "; "           # between them
RESUMED = "hmer.resumed"          # the epoch a resumed run continued from
# A wsd run that started from a shorter run's state where its decay began (hmer.studies.resume.find_branch):
# "<run id>@<epoch>", and that run's train_cpu_seconds there (the cost the two share).
BRANCHED_FROM = "hmer.branched_from"
BRANCH_CPU_SECONDS = "hmer.branch_cpu_seconds"
# The epochs (comma-separated) at which a run went on from a checkpoint carried without its
# optimiser state (hmer.training.carry): its optimiser restarted there.
WARM_RESTART = "hmer.warm_restart"
# The epochs at which a carried run's best-on-validation weights were not carried (an earlier epoch's):
# from there on its best is chosen among the epochs since.
BEST_RESET = "hmer.best_reset"
STOPPED_BY = "hmer.stopped_by"    # a run closed KILLED by SIGTERM/SIGINT: the signal, and where training stood
PID = "hmer.pid"                  # the process that trains the run (the last one, after a resume)
HOST = "hmer.host"                # the machine it runs on: a RUNNING run of this host whose pid is gone died
ATTENTION_MAPS_ERROR = "hmer.attention_maps_error"  # why the attention-map figures are missing
REGISTERED_MODEL = "hmer.registered_model"          # the MLflow model-registry name, when registered

# ---- studies: MLflow tags on parent and child runs, Optuna user attributes ---------------------
STUDY = "hmer.study"              # the Optuna study name (parent and every child run)
ROLE = "hmer.role"                # what a study's own run is for, beside its trials (values below)
ROLE_STUDY = "study"              # the study's parent run
ROLE_SUMMARY = "summary"          # a variant's mean over seeds, a child of the parent run (store.study_run)
KIND = "hmer.kind"                # grid | sweep
BUDGET = "hmer.budget"            # the study budget its runs train at (hmer.studies.budgets)
SPEC = "hmer.spec"                # the study spec's name (ablate_direction, sweep, ...)
GRID = "hmer.grid"                # a grid study's search space, as JSON
SPACE = "hmer.space"              # a sweep's search space, as JSON
EXPERIMENT = "hmer.experiment"    # the MLflow experiment a study logs to
BASELINE = "hmer.baseline"        # a grid study's baseline cell
N_TRIALS = "hmer.n_trials"        # a sweep's trial count
CONFIG = "hmer.config"            # study system attribute: the base config of every cell, flat
PARENT_RUN_ID = "hmer.parent_run_id"  # study user attribute: the MLflow parent run
TRIAL = "hmer.trial"              # the Optuna trial number of a child run
CELL = "hmer.cell"                # a grid cell in words, on a child run
CELL_KEY = "hmer.cell_key"        # trial user attribute: the cell's identity (see studies.spec.cell_key)
SEED = "hmer.seed"                # the child run's seed
WORKER = "hmer.worker"            # trial user attribute: the worker that runs it
FAILED_BY = "hmer.failed_by"      # trial user attribute: who marked a dead worker's trial FAIL
FAILED = "hmer.failed"            # parent-run tag: the trials that failed, in words
# Study system attribute per worker (+ its token): the cell it books, spelt as before bookings had that
# name: the committed optuna.db holds such keys, and new workers must see those of an older commit's (3d6c658).
BOOKING_PREFIX = "hmer.claim:"
RESUMED_FROM = "hmer.resumed_from"  # trial attribute and run tag: the dead trial whose run a trial continued
TRAINED_AGAIN_IN = "hmer.trained_again_in"  # a killed attempt's run tag: the run that trained its cell from the start
REUSED_FROM = "hmer.reused_from"  # trial attribute and run tag: another study's run with the cell's config, copied
SUPERSEDED_BY = "hmer.superseded_by"  # experiment, parent-run tag and study user attribute: the study replacing it
DESCRIPTION = "hmer.description"  # study user attribute: what the study compares, in words (its spec's description)
CONTINUES = "hmer.continues"      # user attribute of a sweep trial: the dead trial it continues
# Trial user attributes a finished trial records (studies.objective.record_result), beside its test
# scores under their metric names with the prefix (`hmer.test_2014_exprate`, ...: `trial_score`).
TRIAL_RUN_ID = "hmer.mlflow_run_id"  # the trial's MLflow run
TRIAL_EPOCHS = "hmer.epochs"         # the epochs it trained
TRIAL_STOPPED_BY = "hmer.stopped_by"  # why it stopped: epochs | budget | target | paused
# A sweep trial given CPU-minutes (studies.sweeps): its measured cost and the epochs that fit.
TRIAL_CPU_SECONDS_PER_IMAGE = "hmer.train_cpu_seconds_per_image"
TRIAL_FITTED_EPOCHS = "hmer.train_epochs"

# ---- moving runs between stores (hmer runs export / import) -----------------------------------
SOURCE_RUN_ID = "hmer.source_run_id"
SOURCE_PARENT_RUN_ID = "hmer.source_parent_run_id"
IMPORTED_FROM = "hmer.imported_from"

# ---- reference checkpoints imported with `hmer import` ----------------------------------------
IMPORT_SOURCE = "hmer.import.source"
IMPORT_REFERENCE = "hmer.import.reference"
IMPORT_LIGHTNING_VERSION = "hmer.import.lightning_version"
IMPORT_EPOCH = "hmer.import.epoch"
IMPORT_HYPER_PARAMETERS = "hmer.import.hyper_parameters"
IMPORT_REFERENCE_ONLY_SYMBOLS = "hmer.import.reference_only_symbols"
IMPORT_NEVER_PREDICTED_SYMBOLS = "hmer.import.never_predicted_symbols"

# ---- MLflow's own reserved tags the suite sets ---------------------------------------------------
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"
MLFLOW_RUN_NAME = "mlflow.runName"
MLFLOW_NOTE = "mlflow.note.content"  # a run's (or experiment's) description in the UI, Markdown
MLFLOW_RUN_COLOR = "mlflow.runColor"  # a run's colour in the UI's tables and charts (#rrggbb)
# What an experiment is for: MLflow's UI chose its GenAI or model-training view by it (tracking/ui.py).
MLFLOW_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
