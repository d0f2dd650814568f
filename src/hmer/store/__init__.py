"""The committed store's upkeep: what is done to a store of studies, not to run one (docs/studies.md):
`publish` with `clean`, `rename`, `present` with `study_run`, and `provenance`. It sits above
`hmer.studies`: no module that runs a study imports it.
"""
