"""The decoding loop (`modeling_vaswani/generation_vaswani.py`) against transformers' own loops.

The reference is the path the loop replaced: transformers' `_beam_search` with the GNMT penalty hooked into its
finalisation and early-stop steps (test-only subclass below), and transformers' `_sample` for greedy search, both
reached through the same public `custom_generate` route. For every case of issue 10 the loop gives the same
sequences, with sequence scores within 1e-5, while computing fewer decoder rows.
"""

import json

import pytest
import torch
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from modeling_vaswani import VaswaniForConditionalGeneration, gnmt_length_penalty

from isolated import run_isolated
from test_generation import trained  # noqa: F401  (the fixture, used by name)

EOS, PAD, START = 2, 1, 0


class Reference(VaswaniForConditionalGeneration):
    """transformers' beam search with the GNMT penalty: score / ((5 + |Y|) / 6)^α when finalising a hypothesis,
    and the best live score over the penalty at the longest allowed length in the early-stop bound."""

    gnmt_alpha = None

    def _update_finished_beams(self, *, topk_log_probs, cur_len, decoder_prompt_len, length_penalty, **kwargs):
        if self.gnmt_alpha is not None:
            topk_log_probs = topk_log_probs / gnmt_length_penalty(cur_len + 1 - decoder_prompt_len, self.gnmt_alpha)
            length_penalty = 0.0
        return super()._update_finished_beams(
            topk_log_probs=topk_log_probs,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty,
            **kwargs,
        )

    def _check_early_stop_heuristic(
        self, *, running_beam_scores, cur_len, max_length, decoder_prompt_len, early_stopping, length_penalty, **kwargs
    ):
        if self.gnmt_alpha is not None:
            longest = max_length - decoder_prompt_len if early_stopping == "never" else cur_len - decoder_prompt_len
            running_beam_scores = running_beam_scores / gnmt_length_penalty(longest, self.gnmt_alpha)
            length_penalty = 0.0
        return GenerationMixin._check_early_stop_heuristic(
            running_beam_scores=running_beam_scores,
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
            **kwargs,
        )


def reference_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """`custom_generate` callable: transformers' `_beam_search` (GNMT hooked in) or `_sample`."""
    if generation_config.num_beams == 1:
        return GenerationMixin._sample(
            model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
        )
    gnmt = getattr(generation_config, "length_penalty_rule", "transformers") == "gnmt"
    model.gnmt_alpha = generation_config.length_penalty if gnmt else None
    try:
        return GenerationMixin._beam_search(
            model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
        )
    finally:
        model.gnmt_alpha = None


@pytest.fixture(scope="module")
def models(one_thread, trained) -> tuple[VaswaniForConditionalGeneration, Reference]:  # noqa: F811 (the fixture)
    """test_generation's half-trained reverser (outputs of varied length), and its reference twin."""
    reference = Reference(trained.config).use_paper_decoding().eval()
    reference.load_state_dict(trained.state_dict())
    return trained, reference


def padded(lengths: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (len(lengths), max(lengths)), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        ids[row, length:], mask[row, length:] = PAD, 0
    return ids, mask


TEN_X = (30, 3, 12, 7, 25, 4)  # the longest source is 10× the shortest


class RowCounter:
    """Counts the decoder rows computed: one forward pre-hook on the decoder stack."""

    def __init__(self, model):
        self.rows, self.calls = 0, 0
        self.handle = model.model.decoder.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.rows += kwargs["input_ids"].shape[0]
        self.calls += 1

    def close(self):
        self.handle.remove()


def both(models, ids, mask, attn="sdpa", **kwargs):
    """(ours, reference) dict outputs with sequence scores, and the decoder rows each computed."""
    model, reference = models
    outputs, rows = [], []
    for m, extra in ((model, {}), (reference, {"custom_generate": reference_loop})):
        m.set_attn_implementation(attn)
        counter = RowCounter(m)
        torch.manual_seed(0)  # the same draws for beam sampling
        outputs.append(
            m.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True, **extra, **kwargs)
        )
        counter.close()
        rows.append(counter.rows)
        m.set_attn_implementation("sdpa")
    return outputs, rows


def assert_same(ours, ref):
    assert torch.equal(ours.sequences, ref.sequences)
    if ref.get("sequences_scores") is not None:
        torch.testing.assert_close(ours.sequences_scores, ref.sequences_scores, atol=1e-5, rtol=0)


BEAM_CASES = {
    "beam4": dict(num_beams=4),
    "min_length": dict(min_length=9),
    "min_new_tokens": dict(min_new_tokens=6),
    "no_repeat_ngram": dict(no_repeat_ngram_size=2),
    "bad_words": dict(bad_words_ids=[[7], [9, 10]]),
    "forced_bos": dict(forced_bos_token_id=5),
    "forced_eos": dict(forced_eos_token_id=EOS, max_new_tokens=6),
    "n_best": dict(num_return_sequences=4),
    "max_new_tokens": dict(max_new_tokens=7),
    **{
        f"{rule}-alpha{alpha}": dict(length_penalty_rule=rule, length_penalty=alpha)
        for rule in ("gnmt", "transformers")
        for alpha in (0.0, 0.6, 1.0)
    },
}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("case", list(BEAM_CASES))
def test_beam_search_equals_transformers_loop(models, case, attn):
    if attn == "eager" and case not in ("beam4", "n_best"):
        pytest.skip("eager attention: the plain and n-best cases suffice")
    ids, mask = padded(TEN_X)
    (ours, ref), (rows_ours, rows_ref) = both(models, ids, mask, attn, **BEAM_CASES[case])
    assert_same(ours, ref)
    assert ref.sequences.shape[1] > 4  # the case decodes something
    plain = models[0].generate(ids, attention_mask=mask, **BEAM_CASES[case])
    assert torch.equal(plain, ours.sequences)  # the tensor output is the dict's sequences
    if "max_new_tokens" not in BEAM_CASES[case]:  # (a short fixed limit: every sentence runs to it)
        assert rows_ours < rows_ref  # finished sentences left the batch
    assert rows_ours <= rows_ref


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_equals_transformers_loop(models, attn):
    model, reference = models
    ids, mask = padded(TEN_X)
    outputs, rows = [], []
    for m, extra in ((model, {}), (reference, {"custom_generate": reference_loop})):
        m.set_attn_implementation(attn)
        counter = RowCounter(m)
        outputs.append(m.generate(ids, attention_mask=mask, num_beams=1, **extra))
        counter.close()
        rows.append(counter.rows)
        m.set_attn_implementation("sdpa")
    assert torch.equal(outputs[0], outputs[1])
    assert outputs[1].eq(PAD).any()  # some rows stopped before others
    assert rows[0] < rows[1]


def test_batch_of_one_and_sentences_at_their_limits(models):
    """Batch 1; then a batch where some sentences stop at their own limit (lowered to |source| + 3 so that this
    model reaches it) while others end before, so sentences leave at different steps for both reasons."""
    ids, mask = padded((6,))
    (ours, ref), _ = both(models, ids, mask)
    assert_same(ours, ref)
    ids, mask = padded(TEN_X, seed=3)
    (ours, ref), (rows_ours, rows_ref) = both(models, ids, mask, max_length_over_source=3)
    assert_same(ours, ref)
    lengths = ref.sequences[:, 1:].ne(PAD).sum(-1)
    limits = mask.sum(-1) + 3
    assert (lengths == limits).any() and (lengths < limits).any()  # some stop at their limit, some before
    assert rows_ours < rows_ref


def test_every_sentence_at_source_plus_50(models):
    """|source| + 50 per sentence with EOS suppressed: every sentence reaches its own limit, then leaves."""
    ids, mask = padded((9, 6, 3))
    (ours, ref), (rows_ours, rows_ref) = both(models, ids, mask, suppress_tokens=[EOS])
    assert_same(ours, ref)
    assert ours.sequences[:, 1:].ne(PAD).sum(-1).tolist() == [59, 56, 53]
    assert rows_ours < rows_ref


class Scaled(LogitsProcessor):
    """A user processor the loop cannot know to be row-wise: it keeps every row, as transformers does."""

    def __call__(self, input_ids, scores):
        return scores * 1.0


def test_rows_stay_with_an_unknown_processor_and_match_step_for_step(models):
    ids, mask = padded(TEN_X)
    (ours, ref), (rows_ours, rows_ref) = both(models, ids, mask, logits_processor=LogitsProcessorList([Scaled()]))
    assert_same(ours, ref)
    assert rows_ours == rows_ref
    assert len(ours.scores) == len(ref.scores)
    for a, b in zip(ours.scores, ref.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_beam_sampling_keeps_every_row_and_draws_as_transformers(models):
    """Beam sampling runs in the loop too (the GNMT rule applies), without dropping: same draws, same results."""
    ids, mask = padded(TEN_X)
    (ours, ref), (rows_ours, rows_ref) = both(models, ids, mask, do_sample=True, num_beams=3, top_k=0)
    assert_same(ours, ref)
    assert rows_ours == rows_ref


def test_per_step_scores_of_departed_sentences_are_minus_inf(models):
    """Documented: `scores` has one (batch·beams, vocab) tensor per step the loop ran; a sentence that left the
    batch has -inf in its rows from then on; the live rows equal transformers' at the same step."""
    ids, mask = padded(TEN_X)
    (ours, ref), _ = both(models, ids, mask)
    assert len(ours.scores) <= len(ref.scores)
    departed = 0
    for a, b in zip(ours.scores, ref.scores, strict=False):  # ours may have fewer steps
        gone = torch.isinf(a).all(-1) & (a < 0).all(-1)
        departed = max(departed, int(gone.sum()))
        torch.testing.assert_close(a[~gone], b[~gone], atol=1e-5, rtol=0)
    assert departed > 0


def test_beam_indices_point_into_the_original_batch(models):
    ids, mask = padded(TEN_X)
    (ours, ref), _ = both(models, ids, mask, num_return_sequences=2)
    assert torch.equal(ours.beam_indices, ref.beam_indices)
    assert ours.sequences.shape[0] == 2 * ids.shape[0]


def test_cross_attention_cache_and_memory_keep_one_row_per_live_source(models):
    model = models[0]
    ids, mask = padded(TEN_X)
    seen = []

    def hook(module, args, kwargs):
        memory, cache = kwargs["encoder_hidden_states"], kwargs["cache"]
        cross = cache.cross_attention_cache
        cross_rows = cross.layers[0].keys.shape[0] if cross.get_seq_length() > 0 else None
        seen.append(
            (kwargs["input_ids"].shape[0], memory.shape[0], kwargs["encoder_attention_mask"].shape[0], cross_rows)
        )

    handle = model.model.decoder.register_forward_pre_hook(hook, with_kwargs=True)
    model.generate(ids, attention_mask=mask)
    handle.remove()
    for step, (rows, sources, mask_rows, cross_rows) in enumerate(seen):
        # the first step decodes one row per sentence (its 4 beams are copies), later ones one row per beam
        assert rows == (1 if step == 0 else 4) * sources and mask_rows == sources and cross_rows in (None, sources)
    assert seen[0][1] == ids.shape[0] and seen[-1][1] < ids.shape[0]


class Collect(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended = True


def test_streamer_gets_the_prompt_then_tokens(models):
    model = models[0]
    ids, mask = padded((6,))
    streamer = Collect()
    out = model.generate(ids, attention_mask=mask, num_beams=1, streamer=streamer)
    assert streamer.ended and streamer.puts[0].tolist() == [[START]]
    assert torch.cat([p.view(1, -1) for p in streamer.puts], dim=1).tolist() == out.tolist()
    streamer = Collect()
    out = model.generate(ids, attention_mask=mask, num_beams=4, streamer=streamer)
    assert streamer.ended and streamer.puts[0].tolist() == [[START]]
    assert streamer.puts[-1].tolist() == out[:, 1:].tolist()  # beam search: the tokens once they are known


CHILD = """
    import json, sys
    import torch
    from transformers import AutoModelForSeq2SeqLM

    folder, payload = sys.argv[1], json.loads(sys.argv[2])
    lm = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids, mask = torch.tensor(payload["ids"]), torch.tensor(payload["mask"])
    out = lm.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True)
    print("RESULT " + json.dumps({
        "tokens": out.sequences.tolist(),
        "scores": out.sequences_scores.tolist(),
        "modules": sorted(n for n in sys.modules if "generation_vaswani" in n),
    }))
"""


def test_model_folder_loaded_through_remote_code_decodes_the_same(models, tmp_path):
    model, reference = models
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    assert (folder / "generation_vaswani.py").is_file()  # the relative import made it travel
    ids, mask = padded(TEN_X)
    child = run_isolated(CHILD, [str(folder), json.dumps({"ids": ids.tolist(), "mask": mask.tolist()})], tmp_path)
    assert child["modules"] and all(m.startswith("transformers_modules.") for m in child["modules"])
    ref = reference.generate(
        ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True, custom_generate=reference_loop
    )
    assert child["tokens"] == ref.sequences.tolist()
    torch.testing.assert_close(torch.tensor(child["scores"]), ref.sequences_scores, atol=1e-5, rtol=0)
