"""The training-curve PNG: losses, validation scores and the learning rate against the step.

Written by `training.train` as OUTPUT_DIR/training_curves.png after every evaluation.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(row["step"], row[key]) for row in history if key in row and "step" in row]
    return [s for s, _ in rows], [v for _, v in rows]


def plot_history(log_history: list[dict], path: str | Path, title: str = "") -> Path:
    """Three panels: training loss (label-smoothed) and NLL with validation loss; validation BLEU/chrF; lr."""
    fig, (ax_loss, ax_bleu, ax_lr) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for key, label in (
        ("loss", "train loss (ε_ls-smoothed)"),
        ("nll", "train NLL"),
        ("eval_loss", "val loss (ε_ls-smoothed)"),
    ):
        steps, values = _series(log_history, key)
        if steps:
            ax_loss.plot(steps, values, marker="o" if key == "eval_loss" else None, ms=3, label=label)
    ax_loss.set_ylabel("loss per target token")
    ax_loss.legend(loc="upper right")
    for key, label in (("eval_bleu", "val BLEU"), ("eval_chrf", "val chrF")):
        steps, values = _series(log_history, key)
        if steps:
            ax_bleu.plot(steps, values, marker="o", ms=3, label=label)
    ax_bleu.set_ylabel("score")
    if ax_bleu.lines:
        ax_bleu.legend(loc="lower right")
    steps, values = _series(log_history, "learning_rate")
    ax_lr.plot(steps, values)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    for ax in (ax_loss, ax_bleu, ax_lr):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
