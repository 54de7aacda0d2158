"""Checkpoints: what makes one complete, the marker and the listing of complete ones (`complete`), the Trainer
callback that writes the marker (`callback`), and averaging the last N (`averaging`, §6.1)."""
