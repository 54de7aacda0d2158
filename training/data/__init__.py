"""Data: parallel corpora in one shape (`parallel`: files, Hub datasets, the default corpus; tokenized and cached as
Arrow), the generated offline default corpus (`corpus`), the shared BPE vocabulary of §5.1 (`tokenizer`),
corpora read as a stream (`streaming`), and a training run's data from `train`'s settings (`prepare`)."""
