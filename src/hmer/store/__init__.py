"""The committed store's upkeep: what is done to a store of finished studies, not to run one.

- `publish` (`hmer runs publish`), with `unfinished` (studies not finished left out, or kept to be
  continued) and `clean` (no machine path, nothing running, every study under its name);
- `rename` (`hmer runs rename | supersede`);
- `present` (`hmer runs present`), with `study_run` and `dashboard` (how both UIs show a study);
- `provenance`: what trained a run (`hmer runs show`).

It sits above `hmer.studies` (docs/architecture.md): it reads a study's records as the studies
write them, and no module that runs a study imports it.
"""
