"""Inference: load a model folder (or Hub model) and translate batches of text; used by every command that decodes."""
