"""ARL paper Fig. 4: similarity and uncertainty distributions of labelled and unpaired
training pairs, one row of panels per branch. On simulated data the unpaired pairs are split
into the truly relevant ones (what detection should find) and the rest."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prvr.harness.base.io import write_png


def _groups(d: dict, key: str) -> list[tuple[str, np.ndarray]]:
    groups = [("positive (labelled)", d[f"positive_{key}"])]
    rel = d.get("unpaired_relevant")
    if rel is None:
        groups.append(("unpaired", d[f"unpaired_{key}"]))
    else:
        groups.append(("unpaired, irrelevant", d[f"unpaired_{key}"][~rel]))
        groups.append(("unpaired, truly relevant", d[f"unpaired_{key}"][rel]))
    return groups


def plot_distributions(figure: dict[str, dict], path: str | Path) -> None:
    """Write the PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(figure), 2, figsize=(10, 3.2 * len(figure)), squeeze=False)
    for row, (branch, d) in enumerate(figure.items()):
        for col, (key, title, tau) in enumerate((("s", "similarity s(q, V)", d["tau_s"]),
                                                 ("u", "uncertainty (U^q + mean_k U^v) / 2", d["tau_u"]))):
            ax = axes[row][col]
            values = np.concatenate([v for _, v in _groups(d, key) if len(v)])
            bins = np.linspace(values.min(), values.max(), 50) if len(values) else 10
            for label, v in _groups(d, key):
                if len(v):
                    ax.hist(v, bins=bins, density=True, alpha=0.45, label=f"{label} (n={len(v)})")
            ax.axvline(tau, color="k", linestyle="--", linewidth=1, label=f"tau = {tau:.3f}")
            ax.set_title(f"branch {branch}: {title}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    write_png(fig, path)  # the suite's one writer: a regular file or none at `path`, written whole


def summarise(figure: dict[str, dict]) -> dict:
    """Means and counts behind the figure, and how the detection region (s > tau_s and
    u > tau_u) splits the sampled unpaired pairs (stored next to the PNG)."""
    out = {}
    for branch, d in figure.items():
        b = {"tau_s": d["tau_s"], "tau_u": d["tau_u"]}
        for key in ("s", "u"):
            for label, v in _groups(d, key):
                b[f"mean_{key} {label}"] = float(np.mean(v)) if len(v) else None
        region = (d["unpaired_s"] > d["tau_s"]) & (d["unpaired_u"] > d["tau_u"])
        b["unpaired_sampled"] = int(len(region))
        b["unpaired_in_region"] = int(region.sum())
        rel = d.get("unpaired_relevant")
        if rel is not None:
            b["relevant_sampled"] = int(rel.sum())
            b["region_precision"] = float(rel[region].mean()) if region.any() else None
            b["region_recall"] = float(region[rel].mean()) if rel.any() else None
            high_s = d["unpaired_s"] > d["tau_s"]
            b["similarity_only_precision"] = float(rel[high_s].mean()) if high_s.any() else None
            b["similarity_only_recall"] = float(high_s[rel].mean()) if rel.any() else None
        out[branch] = b
    return out
