"""The committed store's upkeep: what is done to a store of finished studies, not to run one.

`hmer.studies` runs a study (its trials, its table) into a store; this package keeps the store that
is committed to the checkout and read on other machines (`hmer runs ...`, docs/studies.md):

- `publish`: a workspace copied into `mlruns/`, only when clean (`hmer runs publish`), with
  `unfinished` (studies not finished left out, or kept with the files that continue them) and
  `clean` (what clean means: no machine path, nothing running, every study under its name);
- `rename`: a study renamed in its store, and a kept study labelled superseded
  (`hmer runs rename | supersede`);
- `present`: a study as both UIs show it, brought up to date (`hmer runs present`, and the command
  that runs a study once it ends), with `dashboard` (its notes in optuna-dashboard);
- `provenance`: what trained a run (`hmer runs show`).

It sits above `hmer.studies` (docs/architecture.md): it reads a study's records as the studies
write them (`studies.storage`, `bookings`, `spec`, `resolution`), and no module that runs a study
imports it.
"""
