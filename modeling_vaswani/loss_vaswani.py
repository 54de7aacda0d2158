"""§5.4's training loss: cross-entropy with label smoothing, plain or fused with the pre-softmax linear.

`label_smoothed_nll_loss` works on logits; `fused_label_smoothed_nll_loss` takes the decoder's output and the shared
embedding and never holds the whole (tokens × vocab) logits (tests/test_loss.py, tests/test_fast_paths.py compare
the two, values and gradients).

This file travels to the Hub as remote code with `modeling_vaswani.py`, which imports it relatively.
"""

import math

import torch
import torch.nn.functional as F


def label_smoothed_nll_loss(
    logits: torch.Tensor,  # (B, T, vocab)
    labels: torch.Tensor,  # (B, T), -100 = ignored
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§5.4 label smoothing: (1 - ε_ls)·NLL + ε_ls·(mean over the vocabulary of -log p), per target token.

    Returns (smoothed loss, plain NLL). Both are divided by `num_items_in_batch` when given (the target tokens of
    all accumulation steps, as Trainer passes it), else by this batch's target tokens.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(logits.shape[:-1])}")
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, vocab), fp32
    keep = labels.ne(-100)
    target = labels.masked_fill(~keep, 0).unsqueeze(-1)
    nll = -log_probs.gather(-1, target).squeeze(-1).masked_fill(~keep, 0.0).sum()
    smooth = -log_probs.mean(-1).masked_fill(~keep, 0.0).sum() if epsilon > 0 else nll.new_zeros(())
    denom = _loss_denominator(keep, num_items_in_batch)
    return ((1.0 - epsilon) * nll + epsilon * smooth) / denom, nll / denom


def _loss_denominator(keep: torch.Tensor, num_items_in_batch: int | torch.Tensor | None) -> int | torch.Tensor:
    """Target tokens to divide by: `num_items_in_batch` when given (all accumulation steps), else this batch's; ≥ 1."""
    denom = keep.sum() if num_items_in_batch is None else num_items_in_batch
    return denom.to(keep.device).clamp(min=1) if isinstance(denom, torch.Tensor) else max(denom, 1)


def fused_label_smoothed_nll_loss(
    hidden: torch.Tensor,  # (B, T, d_model): the decoder's output
    weight: torch.Tensor,  # (vocab, d_model): the pre-softmax linear (the shared embedding)
    labels: torch.Tensor,  # (B, T), -100 = ignored
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`label_smoothed_nll_loss(hidden @ weightᵀ, labels, ...)` without the (B·T, vocab) logits ever existing whole.

    The logits, their log-softmax and d loss / d logits are computed FUSED_LOSS_CHUNK // vocab rows at a time in fp32:
    the gradients of `hidden` and `weight` are formed during the forward pass (the loss is the last operation), so
    backward only scales them. Under autocast the two matmuls run in the autocast dtype, as lm_head would.
    """
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(hidden.shape[:-1])}")
    denom = _loss_denominator(labels.ne(-100), num_items_in_batch)
    rows = max(1, FUSED_LOSS_CHUNK // weight.shape[0])  # rows per chunk
    loss, nll = _FusedLoss.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), float(epsilon), rows)
    return loss / denom, nll / denom


FUSED_LOSS_CHUNK = 2**26  # logits elements per chunk of the fused loss: 256 MiB in fp32


class _FusedLoss(torch.autograd.Function):
    """Sums of the smoothed loss and of the NLL over kept rows; their gradients computed `rows` rows at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, epsilon, rows):  # (N, d), (V, d), (N,)
        device_type = hidden.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
        V = weight.shape[0]
        w = weight.detach().to(dtype)  # (V, d)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = None  # (V, d) fp32: the first chunk's product, later chunks added (no zero-filled start)
        loss_sum = hidden.new_zeros((), dtype=torch.float32)
        nll_sum = hidden.new_zeros((), dtype=torch.float32)
        with torch.autocast(device_type, enabled=False):
            for start in range(0, hidden.shape[0], rows):
                h = hidden[start : start + rows].detach().to(dtype)  # (n, d)
                y = labels[start : start + h.shape[0]]
                keep = y.ne(-100)
                target = y.masked_fill(~keep, 0).unsqueeze(-1)  # (n, 1)
                logits = (h @ w.t()).float()  # (n, V), fp32
                lse = torch.logsumexp(logits, dim=-1)  # (n,)
                nll = (lse - logits.gather(-1, target).squeeze(-1)).masked_fill(~keep, 0.0)
                smooth = (lse - logits.mean(-1)).masked_fill(~keep, 0.0)  # mean over the vocabulary of -log p
                nll_sum += nll.sum()
                loss_sum += ((1.0 - epsilon) * nll + epsilon * smooth).sum()
                # d/d logits of (1-ε)·NLL + ε·mean(-log p): softmax - (1-ε)·onehot(y) - ε/V; 0 for ignored rows,
                # without a pass over (n, V) to mask them: their log-normalizer is taken as +inf (softmax 0) and
                # their two constant terms as 0 (kept rows subtract the same fp32 constants as plain scalars would)
                kept = keep.unsqueeze(-1).to(torch.float32)  # (n, 1)
                grad = logits.sub_(lse.masked_fill(~keep, math.inf).unsqueeze(-1)).exp_().sub_(kept * (epsilon / V))
                grad = grad.scatter_add_(-1, target, kept * -(1.0 - epsilon)).to(dtype)  # (n, V)
                grad_hidden[start : start + h.shape[0]] = grad @ w  # (n, d)
                if grad_weight is None:
                    grad_weight = (grad.t() @ h).float()  # (V, d)
                elif dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), h)
                else:
                    grad_weight += (grad.t() @ h).float()
        if grad_weight is None:  # no rows
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad_hidden, grad_weight = ctx.saved_tensors
        # d loss / d weight scaled in place (a (vocab × d) pass and buffer fewer) unless the graph is kept for
        # another backward, which must find the saved gradient unscaled (or compiled: the graph decides its buffers)
        keep_graph = (
            torch.compiler.is_compiling()
            or getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)()
        )
        scale = grad_loss.to(grad_weight.dtype)
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            grad_weight * scale if keep_graph else grad_weight.mul_(scale),
            None,
            None,
            None,
        )
