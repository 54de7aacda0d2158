"""Commands that train, evaluate, translate, average, publish and export the model, over a small library.

Commands (`python -m training.<name>`, thin: arguments and the steps of the job): `train`, `evaluate`, `translate`,
`average`, `publish`, `export`, `demo`, and `threads` (prints the OpenMP settings the commands use).
The library under them, grouped by job; imports run one way, commands → library → `modeling_vaswani`:

- `data/`: corpora in one shape, the default corpus, the shared BPE, streaming;
- `trainer/`: the §5 recipe on Seq2SeqTrainer: token-budget batches, the §5.3 schedule, curves;
- `checkpoints/`: complete checkpoints (marker, listing, resume) and averaging;
- `inference/`: load a model folder and translate batches (the one translation path);
- `evaluation/`: sacreBLEU/chrF and scoring a test set;
- `serving/`: exported programs (transformers' exporters) and CTranslate2 conversion;
- `hub/`: the model card and the upload folder;
- `common/`: errors, shared arguments, files, process settings.
"""

from .threads import apply_command_defaults

apply_command_defaults()  # before any command imports torch; a no-op on plain import (training/threads.py)
