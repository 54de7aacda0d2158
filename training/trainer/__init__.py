"""The §5 training recipe on transformers' Seq2SeqTrainer: `VaswaniTrainer` (`trainer`), token-budget batches
(`batching`), the learning-rate schedule of §5.3 (`schedule`) and the training-curve plot (`plots`); a run's
Trainer built from `train`'s settings (`build`) and its run folder (`run_folder`: no mixed runs, left as found on a
failure before training)."""
