"""The benchmark figures of a lease: read from the `key=value` lines that `hmer bench` and the
benchmarks print, and tabulated in the lease's bench.md with the command of each row. The driver
(tools/gpu_campaign.py) records them; standard library only, as the driver is."""

from __future__ import annotations

import re

_FIGURE = re.compile(r"(\w+)=([-\w./]+)")


def parse_figures(output: str) -> dict:
    """The `key=value` figures that `hmer bench` and the benchmarks print (numbers as numbers)."""
    found: dict = {}
    for line in output.splitlines():
        for key, value in _FIGURE.findall(line):
            try:
                found[key] = float(value)
            except ValueError:
                found[key] = value
    return found


BENCH_COLUMNS = [("what", "what"), ("preset", "preset"), ("setting", "setting"), ("status", "status"),
                 ("images_per_second", "img/s"), ("one_trial_images_per_second", "1 trial img/s"),
                 ("scaling", "scaling"), ("peak_memory_mb", "peak MB"), ("padding_share", "padding"),
                 ("shapes", "shapes"), ("data_wait_share", "data wait"), ("year_seconds_2014", "2014 year s"),
                 ("mean_hyp_tokens", "hyp tokens"), ("unbatched_match", "unbatched match")]


def bench_markdown(rows: list[dict], args) -> str:
    """bench.md: a row per figure the lease recorded (`Campaign.record["bench"]`), then the commands."""
    lines = [f"# GPU campaign benchmarks ({'rehearsal on ' if args.rehearse else ''}{args.device})", "",
             "| " + " | ".join(h for _, h in BENCH_COLUMNS) + " |", "|" + "---|" * len(BENCH_COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(k, "") if r.get(k) is not None else "") for k, _ in BENCH_COLUMNS) + " |"
              for r in rows]
    lines += ["", "Commands (run in this order, the device and data as above):", ""]
    lines += [f"- {r['preset']} {r['setting']}: `{'hmer ' if r['what'] != 'trials' else 'python '}{r['command']}`"
              for r in rows if r.get("command")]
    return "\n".join(lines) + "\n"
