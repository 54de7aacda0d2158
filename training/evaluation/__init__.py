"""Scores: sacreBLEU and chrF through `evaluate` with this project's offline metric (`metrics`, `sacrebleu_metric`),
and a test set translated and scored (`scoring`)."""
