"""Data: parallel corpora in one shape (`parallel`: files, Hub datasets, the default corpus; tokenized and cached as
Arrow), the generated offline default corpus (`corpus`), the shared BPE vocabulary of §5.1 (`tokenizer`), and
corpora read as a stream (`streaming`)."""
