"""The plumbing under §3.2's attention while decoding: keys and values kept across steps, and the decoder rows that
share one source.

- `cached_keys_values`: self-attention appends each step's keys/values to the cache; cross-attention computes the
  encoder output's once per source and reuses them every later step.
- Rows sharing a source: the beams (or samples) of a sentence are g adjacent decoder rows that read one encoder
  output. For eager/sdpa attention it stays one row per source (`share_encoder_output`), and `share_source_rows`
  turns the g rows' queries into g·T_q query positions of that source, so cross-attention keys/values are computed,
  cached and read once per source (tests/test_generation_contracts.py, tests/test_decoding_loop.py).

This file travels to the Hub as remote code with `modeling_vaswani.py`, which imports it relatively.
"""

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.utils import is_torchdynamo_compiling, is_torchdynamo_exporting

KeysValues = tuple[torch.Tensor, torch.Tensor]


def cached_keys_values(
    cache: Cache | None, layer_idx: int, is_cross: bool, project: Callable[[], KeysValues]
) -> KeysValues:
    """(keys, values), each (B_kv, h, T_k, d_k): `project()`'s, appended to the cache (self-attention, all steps so
    far), or the cached ones (cross-attention after its first step: computed once per source)."""
    layer_cache = cache
    if isinstance(cache, EncoderDecoderCache):
        layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
        if is_cross and cache.is_updated.get(layer_idx, False):
            return layer_cache.layers[layer_idx].keys, layer_cache.layers[layer_idx].values
    k, v = project()
    if layer_cache is not None:
        k, v = layer_cache.update(k, v, layer_idx)
        if is_cross and isinstance(cache, EncoderDecoderCache):
            cache.is_updated[layer_idx] = True
    return k, v


def share_source_rows(
    q: torch.Tensor,  # (B, h, T_q, d_k)
    k: torch.Tensor,  # (B_kv, h, T_k, d_k): B_kv = B, or one row per source for cross-attention
    v: torch.Tensor,
    mask: torch.Tensor | None,  # (B or B_kv, 1, T_q, T_k)
    is_cross: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
    """Queries, keys, values and mask laid out so one attention call serves g = B / B_kv rows per source; the last
    item is g when the queries were grouped (undo with `ungroup_weights`), else None."""
    B, h, T, d_k = q.shape
    exporting = is_cross and is_torchdynamo_exporting()
    if exporting:  # torch.export (training/export.py): decoder row b reads source b·B_kv // B, an index computed
        # from values, not shapes, so one program serves any number of rows per source (greedy 1, beams g) with
        # no guard on the two batches' ratio; keys/values stay one row per source in the cache
        rows = torch.arange(B, device=k.device) * k.shape[0] // B  # (B,)
        k, v = k.index_select(0, rows), v.index_select(0, rows)  # (B, h, T_k, d_k)
        if mask is not None:
            mask = mask.index_select(0, rows)  # (B, 1, T_q, T_k)
    group = B // k.shape[0]  # > 1: the beams (or samples) of a source share its cross-attention keys/values
    # compiled: the grouped layout even for g = 1, so the compiled program branches on no group size
    if not (is_cross and not exporting and (group > 1 or is_torchdynamo_compiling())):
        return q, k, v, mask, None
    q = q.view(k.shape[0], group, h, T, d_k).transpose(1, 2).reshape(k.shape[0], h, -1, d_k)  # (B/g, h, g·T_q, d_k)
    if mask is not None and mask.shape[-2] == T and (T > 1 or is_torchdynamo_compiling()):
        mask = mask.repeat(1, 1, group, 1)  # (B/g, 1, g·T_q, T_k)
    return q, k, v, mask, group


def ungroup_weights(weights: torch.Tensor | None, group: int | None, B: int, T: int) -> torch.Tensor | None:
    """Attention weights back to one row per decoder row: (B/g, h, g·T_q, T_k) → (B, h, T_q, T_k)."""
    if group is None or weights is None:
        return weights
    h = weights.shape[1]
    return weights.view(B // group, h, group, T, -1).transpose(1, 2).reshape(B, h, T, -1)


def share_encoder_output(
    attn_implementation: str, B: int, memory: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decoder rows b·g … b·g+g-1 (beams, samples) read source b: kept as one row per source for eager/sdpa
    attention (keys/values computed and cached once per source), repeated g times for other kernels."""
    if is_torchdynamo_compiling():  # a runtime check, not a guard fixing the traced batches' ratio
        torch._check(B % memory.shape[0] == 0)
    elif B % memory.shape[0] != 0:
        raise ValueError(
            f"the decoder batch ({B}) must be a multiple of the encoder batch ({memory.shape[0]}): "
            "each source's rows (e.g. its beams) next to each other"
        )
    if attn_implementation in ("eager", "sdpa"):
        return memory, mask
    group = B // memory.shape[0]
    mask = mask.repeat_interleave(group, dim=0) if isinstance(mask, torch.Tensor) else mask
    return memory.repeat_interleave(group, dim=0), mask
