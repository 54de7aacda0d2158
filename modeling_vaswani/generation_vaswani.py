"""§6.1 decoding as one loop: beam search and greedy search that drop a sentence from the batch the step it finishes.

transformers' beam search keeps every finished sentence in the batch, and recomputes it, until the last sentence of
the batch stops; fairseq (`finalize_hypos`, then its `batch_idxs` pruning) and CTranslate2 (`BeamSearch::search`,
`non_finished_index`) remove a sentence the step it finishes. This loop does the same with the transformers pieces:
`generate()` prepares the inputs, generation config, logits processors and stopping criteria as usual and calls
`decode` through its public `custom_generate=<callable>` route. The scoring is transformers' `_beam_search` step for
step (top 2·num_beams continuations, finished hypotheses merged by length-penalised score, the early-stop bound), with
the length penalty chosen by `length_penalty_rule`: "gnmt", lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016, the rule §6.1
uses), or "transformers", |Y|^α. tests/test_decoding_loop.py checks it against transformers' own loops.

A sentence leaves the batch when it has `num_beams` finished hypotheses and no live beam can still beat the worst of
them (the bound: the best live score over the penalty at the sentence's own longest allowed length, exact because
log-probabilities only add up to lower scores), or when it reaches its own limit (|source| + 50). From the next step
on its rows are gone from the decoder input, the self-attention cache, the cross-attention cache (one row per source,
shared by its beams), the encoder output and its mask. Greedy search drops a row once it has stopped.

Rows stay (every sentence decodes until the whole batch stops, exactly as transformers' loops) when dropping cannot be
done without changing a result: a cache that is not a fresh `DynamicCache` pair (static caches, a cache passed in to
continue from), per-step attentions or hidden states requested, beam sampling (its random draws span the batch), or
a logits processor or stopping criterion not known to treat each row on its own (e.g. `prefix_allowed_tokens_fn`,
whose callback receives batch indices).

`paper_generate_kwargs` is what `VaswaniForConditionalGeneration.generate` adds to `GenerationMixin.generate`.

This file travels to the Hub as remote code with `modeling_vaswani.py`, which imports it relatively.
"""

import copy
import math

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import GenerateBeamEncoderDecoderOutput
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_outputs import BaseModelOutput

NEG = -1.0e9  # transformers' beam search marks impossible candidates with this score; kept for identical results


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """lp(Y) = ((5 + |Y|) / (5 + 1))^α (Wu et al., 2016, Eq. 14), the rule §6.1 uses with α = 0.6."""
    return ((5.0 + length) / 6.0) ** alpha


class SourceLengthCriteria(sc.StoppingCriteria):
    """§6.1: stop a sentence after |source| + extra output tokens (batch rows grouped per source, as generate does).

    `decode` reads `max_new` and applies it per sentence itself; transformers' loops (sampling) call this."""

    def __init__(self, max_new: torch.Tensor):
        self.max_new = max_new  # (B,)
        self.start: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs) -> torch.BoolTensor:
        if self.start is None:  # first call: one new token after the decoder prompt
            self.start = input_ids.shape[1] - 1
        limit = self.max_new.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.max_new.shape[0])
        return (input_ids.shape[1] - self.start) >= limit


class EosBanUntil(lp.LogitsProcessor):
    """EOS scores are -inf while the sequences (decoder prompt included) are shorter than `length`: the min-length
    processors' result, written into the EOS column of the loop's own fresh scores instead of a full-vocabulary copy."""

    def __init__(self, eos_token_id: torch.Tensor, length: int):
        self.eos = torch.as_tensor(eos_token_id).flatten()
        self.length = length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] >= self.length:
            return scores
        return scores.index_fill_(-1, self.eos.to(scores.device), -math.inf)  # (B, vocab), in place


def beam_topk(log_probs: torch.Tensor, beam_scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best (beam score + log-probability) of each sentence over all its beams, and their indices into the
    flattened (beams × vocabulary) scores: what torch.topk over those flattened sums gives (transformers' beam step).
    log_probs (n, nb, V), beam_scores (n, nb). Each beam's k best tokens first, then the sentence's k best of those
    nb·k: a beam's score adds the same number to all its tokens and a rounded sum keeps their order, so the
    sentence's k best are among them; no pass adds the scores over the (rows × vocabulary) log-probabilities.
    Tested against the flat topk (tests/test_fast_paths.py)."""
    n, nb, V = log_probs.shape
    if k >= V:
        return torch.topk((log_probs + beam_scores[:, :, None]).view(n, nb * V), k)
    best, best_token = torch.topk(log_probs, k)  # (n, nb, k)
    candidates = (best + beam_scores[:, :, None]).view(n, nb * k)
    scores, pick = torch.topk(candidates, k)  # (n, k)
    return scores, (pick // k) * V + best_token.view(n, nb * k).gather(1, pick)


# Processors and criteria that look at each row's own tokens and scores only: with these a sentence can leave the
# batch without changing what the others get. Exact types: a subclass may do anything.
_ROW_WISE_PROCESSORS = tuple(
    getattr(lp, name)
    for name in (
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "RepetitionPenaltyLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "ExponentialDecayLengthPenalty",
        "InfNanRemoveLogitsProcessor",
        "LogitNormalization",
        "TemperatureLogitsWarper",
    )
    if hasattr(lp, name)
) + (EosBanUntil,)
_ROW_WISE_CRITERIA = (sc.MaxLengthCriteria, sc.MaxTimeCriteria, sc.StopStringCriteria, sc.EosTokenCriteria)
_MODE_FIELDS = (
    "num_beams",
    "do_sample",
    "num_beam_groups",
    "top_k",
    "penalty_alpha",
    "constraints",
    "force_words_ids",
    "prompt_lookup_num_tokens",
    "assistant_early_exit",
    "use_mtp",
)
_PASSED_THROUGH = {"output_attentions", "output_hidden_states"}  # model kwargs the loop forwards unchanged


def uses_decode(generation_config, kwargs: dict) -> bool:
    """Whether `generate()` routes to `decode`: beam search and beam sampling always (the length penalty rule lives
    here); greedy search when it returns plain sequences with a dynamic cache (dict outputs, static caches and their
    auto-compilation keep transformers' `_sample`, which honours all of them). Sampling, contrastive and assisted
    decoding: transformers' loops."""
    if kwargs.get("custom_generate") is not None:
        return False
    probe = copy.copy(generation_config)  # the fields that decide the mode, as generate() will merge them
    for key in _MODE_FIELDS:
        if key in kwargs:
            setattr(probe, key, kwargs[key])
    mode = probe.get_generation_mode(kwargs.get("assistant_model"))
    if mode in (GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE):
        return True
    if mode != GenerationMode.GREEDY_SEARCH:
        return False
    get = lambda key: kwargs.get(key, getattr(generation_config, key, None))  # noqa: E731
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    return not get("return_dict_in_generate") and get("cache_implementation") is None and cache is None


def paper_generate_kwargs(model, inputs, generation_config, kwargs: dict) -> dict:
    """`generate()`'s keyword arguments with §6.1's rules added: at most |source| + `max_length_over_source` tokens
    per sentence unless `max_length`/`max_new_tokens` is given (`SourceLengthCriteria`), `length_penalty_rule`
    checked, and beam search (greedy search returning plain sequences) routed to `decode` (`uses_decode`)."""
    config = generation_config if generation_config is not None else model.generation_config
    rule = kwargs.get("length_penalty_rule", getattr(config, "length_penalty_rule", "transformers"))
    if rule not in ("gnmt", "transformers"):
        raise ValueError(f"length_penalty_rule must be 'gnmt' or 'transformers', got {rule!r}")
    extra = kwargs.get("max_length_over_source", getattr(config, "max_length_over_source", None))
    ids = inputs if inputs is not None else kwargs.get("input_ids")
    length_given = any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens")) or (
        generation_config is not None and (config.max_length is not None or config.max_new_tokens is not None)
    )
    if extra is not None and not length_given and isinstance(ids, torch.Tensor) and ids.dim() == 2:
        mask = kwargs.get("attention_mask")
        source_len = mask.sum(-1) if mask is not None else ids.ne(model.config.pad_token_id).sum(-1)
        kwargs["max_new_tokens"] = int(source_len.max()) + extra  # one sync per call, none per step
        criteria = sc.StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
        criteria.append(SourceLengthCriteria(source_len + extra))
        kwargs["stopping_criteria"] = criteria
    if uses_decode(config, kwargs):
        kwargs["custom_generate"] = decode
        # generate() would hand the streamer the prompt with one row per beam; decode streams one per source
        kwargs["token_streamer"] = kwargs.pop("streamer", None)
    return kwargs


def one_cross_attention_row_per_sequence(output):
    """`generate()`'s output, its returned cache with one cross-attention row per sequence, as Marian's (the beams
    shared one while decoding); encoder outputs stay one row per source, as Marian's too.
    tests/test_generation_contracts.py compares every output field's shape with MarianMTModel's."""
    cache = None if isinstance(output, torch.Tensor) else getattr(output, "past_key_values", None)
    cross = cache.cross_attention_cache if isinstance(cache, EncoderDecoderCache) else None
    if type(cross) is DynamicCache and cross.get_seq_length() > 0:
        rows = cache.self_attention_cache.layers[0].keys.shape[0]
        shared = cross.layers[0].keys.shape[0]
        if rows != shared and rows % shared == 0:
            cross.batch_repeat_interleave(rows // shared)
    return output


def last_position_logits(outputs) -> torch.Tensor:
    """The last position's logits in fp32, (rows, V): a view when the step fed one token (the usual decoding step),
    else a copy, so that the prompt's (rows, T, V) logits are not kept alive by it."""
    logits = outputs.logits  # (rows, T, V)
    if logits.shape[1] == 1:
        return logits[:, -1, :].float()  # no copy when fp32: a 4.7 MB copy per step at batch 32, vocabulary 37,000
    return logits[:, -1, :].to(copy=True, dtype=torch.float32)


def decode(
    model,
    input_ids: torch.LongTensor,
    logits_processor: lp.LogitsProcessorList,
    stopping_criteria: sc.StoppingCriteriaList,
    generation_config,
    token_streamer=None,
    **model_kwargs,
):
    """`custom_generate` callable: beam search (or beam sampling) when `num_beams` > 1, else greedy search."""
    state = _Batch(
        model, input_ids, logits_processor, stopping_criteria, generation_config, token_streamer, model_kwargs
    )
    return state.beam_search() if generation_config.num_beams > 1 else state.greedy_search()


class _Batch:
    """The live sentences of one `generate` call: their encoder output, mask, cache and per-sentence limits."""

    def __init__(self, model, input_ids, processors, criteria, config, streamer, model_kwargs):
        self.model, self.config, self.streamer = model, config, streamer
        self.g = config.num_beams  # decoder rows per source: generate() repeated the encoder output g times
        self.prompt = input_ids.shape[1]
        self.input_ids = input_ids
        B = input_ids.shape[0] // self.g
        self.B = B
        self.device = input_ids.device
        encoder_outputs = model_kwargs.pop("encoder_outputs")
        self.encoder_outputs = encoder_outputs
        mask = model_kwargs.pop("attention_mask", None)
        # one row per source (rows b·g … b·g+g-1 are copies of source b): the decoder shares it across the g rows
        self.memory = encoder_outputs.last_hidden_state[:: self.g]  # (B, T_src, d_model)
        self.mask = mask[:: self.g] if mask is not None else None  # (B, T_src)
        self.decoder_mask = model_kwargs.pop("decoder_attention_mask", None)  # (B·g, T_prompt) if given
        cache_key = "cache" if "cache" in model_kwargs else "past_key_values"
        self.cache = model_kwargs.pop(cache_key, None)
        self.use_cache = model_kwargs.pop("use_cache", True) and self.cache is not None
        self.past = self.cache.get_seq_length() if self.cache is not None else 0
        for key in (
            "labels",
            "next_sequence_length",
        ):  # never forwarded, as transformers' prepare_inputs_for_generation
            model_kwargs.pop(key, None)  # (Seq2SeqTrainer's evaluation passes `labels` to generate())
        self.extra = model_kwargs  # output_attentions / output_hidden_states, or whatever the caller added

        limits, kept = None, sc.StoppingCriteriaList()
        for c in criteria:
            if isinstance(c, SourceLengthCriteria):
                limits = c.max_new.to(self.device)
            else:
                kept.append(c)
        self.criteria = kept
        self.max_length = config.max_length  # prompt + the longest any sentence may grow
        longest = self.max_length - self.prompt
        self.limit = (limits.clamp(max=longest) if limits is not None else torch.full((B,), longest)).to(self.device)
        self.processors = lp.LogitsProcessorList(
            EosBanUntil(p.eos_token_id, p.min_length)
            if type(p) is lp.MinLengthLogitsProcessor
            else EosBanUntil(p.eos_token_id, p.prompt_length_to_skip + p.min_new_tokens)
            if type(p) is lp.MinNewTokensLengthLogitsProcessor
            else p
            for p in processors
        )
        fresh_dynamic = self.cache is None or (
            isinstance(self.cache, EncoderDecoderCache)
            and type(self.cache.self_attention_cache) is DynamicCache
            and type(self.cache.cross_attention_cache) is DynamicCache
            and self.past == 0
        )
        self.drop = (
            fresh_dynamic
            and not config.do_sample  # beam sampling keeps every row: the same random draws as transformers'
            and set(self.extra) <= _PASSED_THROUGH
            and not any(self.extra.values())
            and all(type(p) in _ROW_WISE_PROCESSORS for p in self.processors)
            and all(type(c) in _ROW_WISE_CRITERIA for c in self.criteria)
        )
        self.alive = torch.arange(B, device=self.device)  # original index of each live sentence
        eos = config.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        # finished rows and unused slots hold pad (eos, else -1, without one), as transformers' loops
        self.fill = config.pad_token_id if config.pad_token_id is not None else (self.eos[0] if self.eos else -1)

    # ---- the model ----

    def forward(self, ids: torch.Tensor, step: int):
        """One decoder step over the live rows; the first step feeds the whole prompt (past the cache passed in)."""
        if self.use_cache:
            ids = ids[:, self.past :] if step == 0 else ids[:, -1:]
        out = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=self.memory),
            attention_mask=self.mask,
            decoder_input_ids=ids,
            decoder_attention_mask=self.decoder_mask,
            cache=self.cache if self.use_cache else None,
            use_cache=self.use_cache,
            return_dict=True,
            **self.extra,
        )
        if self.decoder_mask is not None:
            self.decoder_mask = torch.cat([self.decoder_mask, self.decoder_mask.new_ones(ids.shape[0], 1)], dim=-1)
        return out

    def keep(self, rows: torch.Tensor, sources: torch.Tensor | None) -> None:
        """Next step's decoder rows are `rows` (beam reorder and departures in one index); `sources` the live ones."""
        if self.cache is not None and self.use_cache:
            self.cache.self_attention_cache.reorder_cache(rows)  # keys/values: (rows, h, T, d_k)
            if sources is not None:
                self.cache.cross_attention_cache.batch_select_indices(sources)  # one row per source
        if self.decoder_mask is not None:
            self.decoder_mask = self.decoder_mask[rows]
        if sources is not None:
            self.memory = self.memory[sources]
            self.mask = self.mask[sources] if self.mask is not None else None
            self.limit = self.limit[sources]
            self.alive = self.alive[sources]

    def penalty(self, length):
        """The length penalty of the rule in use: GNMT ((5 + |Y|) / 6)^α, or transformers' |Y|^α."""
        alpha = self.config.length_penalty
        if getattr(self.config, "length_penalty_rule", "transformers") == "gnmt":
            return gnmt_length_penalty(length, alpha)
        return length**alpha

    def stream(self, tokens: torch.Tensor) -> None:
        if self.streamer is not None:
            self.streamer.put(tokens.cpu())

    def dict_output(self, cls, **fields):
        """generate()'s dict output; the cache field is `cache` (transformers ≥ 5.x renamed `past_key_values`)."""
        name = "cache" if "cache" in cls.__dataclass_fields__ else "past_key_values"
        enc = self.encoder_outputs
        a, h = self.config.output_attentions, self.config.output_hidden_states
        return cls(
            encoder_attentions=enc.get("attentions") if a else None,  # one row per source, as Marian's
            encoder_hidden_states=enc.get("hidden_states") if h else None,
            **{name: self.cache},
            **fields,
        )

    # ---- greedy ----

    def greedy_search(self):
        """Argmax each step; a row leaves once it has stopped (EOS, its own limit, a stopping criterion)."""
        B, device, pad = self.B, self.device, self.fill
        self.stream(self.input_ids)
        out = torch.full((B, self.max_length), pad, dtype=torch.long, device=device)
        out[:, : self.prompt] = self.input_ids
        seqs, cur, step = self.input_ids, self.prompt, 0
        unfinished = torch.ones(B, dtype=torch.bool, device=device)  # rows kept: stopped ones decode on pad
        while seqs.shape[0] > 0 and cur < self.max_length:
            logits = last_position_logits(self.forward(seqs, step))  # (n, V)
            # max's indices are argmax's (the first of tied maxima, NaN as the maximum), and on CPU it runs
            # ~3× faster over (32 × 37,000) scores: it is vectorized where argmax is not (tests/test_fast_paths.py)
            tokens = self.processors(seqs, logits).max(-1).indices  # (n,)
            if not self.drop:
                tokens = torch.where(unfinished, tokens, pad)  # as transformers' loop: pad after a row stops
            seqs = torch.cat([seqs, tokens[:, None]], dim=-1)
            out[self.alive, cur] = tokens
            cur, step = cur + 1, step + 1
            stopped = self.criteria(seqs, None) | ((cur - self.prompt) >= self.limit)
            self.stream(out[:, cur - 1])  # rows that left get pad
            if not self.drop:
                unfinished &= ~stopped
                if not unfinished.any():
                    break
            elif stopped.any():
                keep = (~stopped).nonzero().squeeze(1)
                seqs = seqs[keep]
                self.keep(keep, keep)
        if self.streamer is not None:
            self.streamer.end()
        return out[:, :cur]

    # ---- beam search ----

    def beam_search(self):
        """transformers' beam search step for step, per sentence, with the chosen length penalty; done sentences leave."""
        cfg, B, nb, device = self.config, self.B, self.g, self.device
        prompt, max_length = self.prompt, self.max_length
        fill = self.fill
        K = max(2, 1 + len(self.eos)) * nb  # continuations kept per sentence, as transformers
        top_nb = torch.arange(K, device=device) < nb
        early = cfg.early_stopping
        never = early == "never"
        positive = cfg.length_penalty > 0.0
        ret = cfg.return_dict_in_generate
        want_scores, want_logits = ret and cfg.output_scores, ret and cfg.output_logits
        want_attn, want_hidden = ret and cfg.output_attentions, ret and cfg.output_hidden_states
        all_scores, raw_logits = () if want_scores else None, () if want_logits else None
        dec_attn, cross_attn, dec_hidden = (), (), ()

        self.stream(self.input_ids[::nb])
        running = torch.full((B, nb, max_length), fill, dtype=torch.long, device=device)
        running[:, :, :prompt] = self.input_ids.view(B, nb, prompt)
        running_scores = torch.zeros(B, nb, device=device)
        running_scores[:, 1:] = NEG  # only the first beam's continuations count in the first step
        running_bidx = torch.full((B, nb, max_length - prompt), -1, dtype=torch.int32, device=device)
        # finished hypotheses per sentence (transformers: `sequences`, `beam_scores`, `beam_indices`)
        fin, fin_scores, fin_bidx = running.clone(), torch.full((B, nb), NEG, device=device), running_bidx.clone()
        is_fin = torch.zeros(B, nb, dtype=torch.bool, device=device)
        open_ = torch.ones(B, 1, dtype=torch.bool, device=device)  # improvement still possible
        out_fin, out_scores, out_bidx = fin.clone(), fin_scores.clone(), fin_bidx.clone()  # departed sentences

        # the first step decodes one row per sentence (its beams are copies of one prompt, as CTranslate2 does): the
        # cache then holds one row per sentence, and the first reorder (`rows // nb`) fans it out to the beams
        one_row = (
            self.drop
            and self.use_cache
            and self.past == 0
            and self.decoder_mask is None
            and nb > 1
            and bool((running[:, :, :prompt] == running[:, :1, :prompt]).all())
        )
        cur, step = prompt, 0
        while cur < max_length:
            n = running.shape[0]
            flat = running[:, :, :cur].reshape(n * nb, cur)
            if step == 0 and one_row:
                logits = last_position_logits(self.forward(running[:, 0, :cur], step)).repeat_interleave(nb, dim=0)
                outputs = None
            else:
                outputs = self.forward(flat, step)
                logits = last_position_logits(outputs)  # (n·nb, V)
            log_probs = self.processors(flat, F.log_softmax(logits, dim=-1))
            V = log_probs.shape[-1]
            if want_scores or want_logits:  # one row per beam of the original batch
                rows = (self.alive[:, None] * nb + torch.arange(nb, device=device)).flatten()
                if want_scores:  # rows of sentences that already left: -inf
                    all_scores += (log_probs.new_full((B * nb, V), -math.inf).index_copy_(0, rows, log_probs),)
                if want_logits:
                    raw_logits += (logits.new_full((B * nb, V), -math.inf).index_copy_(0, rows, logits),)
            if want_attn:
                dec_attn += (outputs.decoder_attentions,)
                cross_attn += (outputs.cross_attentions,)
            if want_hidden:
                dec_hidden += (outputs.decoder_hidden_states,)
            del outputs

            # top K continuations of each sentence over all its beams
            if cfg.do_sample:  # beam sampling: K draws without replacement, best first
                scores = (log_probs.view(n, nb, V) + running_scores[:, :, None]).view(n, nb * V)
                topk_idx = torch.multinomial(F.softmax(scores, dim=-1), num_samples=K)
                topk_scores, order = scores.gather(1, topk_idx).sort(dim=-1, descending=True)
                topk_idx = topk_idx.gather(1, order)
            else:
                topk_scores, topk_idx = beam_topk(log_probs.view(n, nb, V), running_scores, K)
            parent, token = topk_idx // V, topk_idx % V  # (n, K)
            topk_seq = torch.take_along_dim(running, parent[:, :, None], dim=1)
            topk_seq[:, :, cur] = token
            topk_bidx = torch.take_along_dim(running_bidx, parent[:, :, None], dim=1)
            topk_bidx[:, :, cur - prompt] = (parent + self.alive[:, None] * nb).to(torch.int32)

            # which continuations stop here: the criteria (EOS, max_length, ...) and the sentence's own limit
            hits = self.criteria(topk_seq[:, :, : cur + 1].reshape(n * K, cur + 1), all_scores).view(n, K)
            hits = hits | ((cur + 1 - prompt) >= self.limit)[:, None]

            # the best num_beams live continuations go on
            live_scores = topk_scores + hits.to(torch.float32) * NEG
            nxt = torch.topk(live_scores, k=nb)[1]
            running = torch.take_along_dim(topk_seq, nxt[:, :, None], dim=1)
            running_scores = torch.take_along_dim(live_scores, nxt, dim=1)
            running_bidx = torch.take_along_dim(topk_bidx, nxt[:, :, None], dim=1)
            next_parent = torch.take_along_dim(parent, nxt, dim=1)  # (n, nb): the beam each one continues

            # finished continuations among the top num_beams enter the sentence's n-best if they score higher
            just = hits & top_nb
            final = topk_scores / self.penalty(cur + 1 - prompt)
            final = final + (is_fin.all(-1, keepdim=True) & (early is True)).to(torch.float32) * NEG
            final = final + (~open_).to(torch.float32) * NEG
            final = final + (~just) * NEG
            merged = torch.topk(torch.cat((fin_scores, final), dim=1), k=nb)[1]
            fin = torch.take_along_dim(torch.cat((fin, topk_seq), dim=1), merged[:, :, None], dim=1)
            fin_scores = torch.take_along_dim(torch.cat((fin_scores, final), dim=1), merged, dim=1)
            fin_bidx = torch.take_along_dim(torch.cat((fin_bidx, topk_bidx), dim=1), merged[:, :, None], dim=1)
            is_fin = torch.take_along_dim(torch.cat((is_fin, just), dim=1), merged, dim=1)

            cur, step = cur + 1, step + 1
            # can a live beam still beat the worst finished hypothesis? Its best final score is its score now over
            # the penalty at the most favourable length: the longest allowed under "never" with α > 0 (the
            # sentence's own limit when sentences leave, the batch's when they stay, as transformers), else now.
            if never and positive:
                best_len = self.limit[:, None] if self.drop else max_length - prompt
            else:
                best_len = cur - prompt
            best = running_scores[:, :1] / self.penalty(best_len)
            worst = torch.where(is_fin, fin_scores.min(dim=1, keepdim=True)[0], NEG)
            open_ = open_ & (best > worst).any(dim=-1, keepdim=True)

            rows_local = torch.arange(n, device=device)[:, None] * nb + next_parent  # (n, nb)
            if step == 1 and one_row:  # the cache has one row per sentence after the first step
                rows_local = rows_local // nb
            if self.drop:
                done = ~open_[:, 0] | hits.all(-1)
                if early is True:
                    done |= is_fin.all(-1)
                if done.any():
                    gone = done.nonzero().squeeze(1)
                    out_fin[self.alive[gone]] = fin[gone]
                    out_scores[self.alive[gone]] = fin_scores[gone]
                    out_bidx[self.alive[gone]] = fin_bidx[gone]
                    if bool(done.all()):
                        self.alive = self.alive[:0]
                        break
                    keep = (~done).nonzero().squeeze(1)
                    running, running_scores, running_bidx = running[keep], running_scores[keep], running_bidx[keep]
                    fin, fin_scores, fin_bidx, is_fin = fin[keep], fin_scores[keep], fin_bidx[keep], is_fin[keep]
                    open_ = open_[keep]
                    self.keep(rows_local[keep].flatten(), keep)
                    continue
            self.keep(rows_local.flatten(), None)
            if not self.drop and not (open_.any() & ~(is_fin.all() & (early is True)) & ~hits.all()):
                break  # transformers' stopping rule for the whole batch

        if self.alive.numel():  # sentences still in the batch at the end
            out_fin[self.alive], out_scores[self.alive], out_bidx[self.alive] = fin, fin_scores, fin_bidx

        # the n-best of each sentence in the original order, cropped to the longest returned hypothesis
        nrs = cfg.num_return_sequences
        sequences = out_fin[:, :nrs].reshape(B * nrs, max_length)
        scores = out_scores[:, :nrs].reshape(B * nrs)
        beam_indices = out_bidx[:, :nrs].reshape(B * nrs, -1)
        generated = int((beam_indices + 1).bool().sum(dim=1).max())
        sequences, beam_indices = sequences[:, : prompt + generated], beam_indices[:, :generated]
        if self.streamer is not None:
            self.stream(sequences[:, prompt:])
            self.streamer.end()
        if not ret:
            return sequences
        return self.dict_output(
            GenerateBeamEncoderDecoderOutput,
            sequences=sequences,
            sequences_scores=scores if cfg.output_scores else None,
            scores=all_scores if want_scores else None,
            logits=raw_logits if want_logits else None,
            beam_indices=beam_indices,
            decoder_attentions=dec_attn if want_attn else None,
            cross_attentions=cross_attn if want_attn else None,
            decoder_hidden_states=dec_hidden if want_hidden else None,
        )
