"""The §5 training recipe on transformers' Seq2SeqTrainer: `VaswaniTrainer` (`trainer`), token-budget batches
(`batching`), the learning-rate schedule of §5.3 (`schedule`) and the training-curve plot (`plots`)."""
