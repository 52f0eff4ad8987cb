"""`rlvr plot`: each run keeps its own colour in every panel, and the legend names every run."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.plot import PANELS, figure


def _run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_a_run_keeps_its_colour_where_an_earlier_run_lacks_the_metric(tmp_path):
    """The first run has no KL term (no `kl` logged), the second has: the KL panel draws the second run in
    the second run's colour, not in the colour the first run has everywhere else."""
    import matplotlib.pyplot as plt

    plain = _run(tmp_path / "plain", [{"step": k, "reward/mean": 0.1 * k} for k in (1, 2, 3)])
    with_kl = _run(tmp_path / "kl", [{"step": k, "reward/mean": 0.2 * k, "kl": 0.01 * k} for k in (1, 2, 3)])
    fig = figure([plain, with_kl])
    panels = dict(zip([key for key, _ in PANELS], fig.axes, strict=False))
    reward_colours = [line.get_color() for line in panels["reward/mean"].lines]
    assert len(reward_colours) == 2 and reward_colours[0] != reward_colours[1]
    assert [line.get_color() for line in panels["kl"].lines] == [reward_colours[1]]
    legend = fig.legends[0]
    assert [h.get_color() for h in legend.legend_handles] == reward_colours  # every run, in its colour
    assert len(legend.get_texts()) == 2
    plt.close(fig)
