"""save_pretrained / from_pretrained round trips, remote code, gradient checkpointing and Seq2SeqTrainer."""

import filecmp
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, GenerationConfig

import modeling_vaswani
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

from isolated import run_isolated

TINY = dict(vocab_size=99, d_model=16, d_ff=32, h=2, encoder_layers=2, decoder_layers=2, p_drop=0.0)
PACKAGE_DIR = Path(modeling_vaswani.__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}


def make_model(seed: int = 0, **overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    return VaswaniForConditionalGeneration(VaswaniConfig(**{**TINY, **overrides})).eval()


def assert_tied(model: VaswaniForConditionalGeneration) -> None:
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared


def stored_tensors(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every tensor in model.safetensors, read without loading the model."""
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


@pytest.fixture(scope="module")
def model() -> VaswaniForConditionalGeneration:
    return make_model()


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vaswani") / "checkpoint"
    model.use_paper_decoding().save_pretrained(folder)  # as training/train.py saves it
    return folder


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 1, 1]])
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids.ne(1).long(),
        "decoder_input_ids": torch.tensor([[0, 13, 14, 15], [0, 16, 17, 2]]),
    }


def test_save_writes_safetensors_config_generation_config_and_code(saved):
    """model.safetensors, no pickle, config.json with auto_map, generation_config.json, and exactly the code files
    `code_files()` derives from the modeling file's relative imports: every sibling of the package."""
    files = {p.name for p in saved.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json"} <= files
    siblings = {p.name for p in PACKAGE_DIR.glob("*_vaswani.py")}
    assert set(modeling_vaswani.code_files()) == siblings  # a new sibling not imported by the modeling file fails
    assert {"kernels_vaswani.py", "loss_vaswani.py", "pipeline_vaswani.py", "generation_vaswani.py"} <= siblings
    assert {name for name in files if name.endswith(".py")} == siblings
    assert not [p for p in saved.rglob("*") if p.suffix in PICKLE_SUFFIXES]
    config = json.loads((saved / "config.json").read_text())
    assert config["model_type"] == "vaswani"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vaswani.VaswaniConfig",
        "AutoModel": "modeling_vaswani.VaswaniModel",
        "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
    }
    for name in modeling_vaswani.code_files():
        assert filecmp.cmp(saved / name, PACKAGE_DIR / name, shallow=False), f"{name} is not a copy of ours"
    generation = json.loads((saved / "generation_config.json").read_text())
    assert generation["num_beams"] == 4
    assert generation["length_penalty"] == 0.6
    assert generation["length_penalty_rule"] == "gnmt"
    assert generation["max_length_over_source"] == 50


def test_tied_matrix_stored_once_and_no_positional_table(model, saved):
    """One vocab × d_model tensor; every stored tensor is a parameter; nothing positional."""
    tensors = stored_tensors(saved)
    vocab_by_width = [k for k, (shape, _) in tensors.items() if shape == (TINY["vocab_size"], TINY["d_model"])]
    assert len(vocab_by_width) == 1, vocab_by_width
    all_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert set(tensors) <= all_names, set(tensors) - all_names
    tied_aliases = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    assert set(tensors) | tied_aliases | {"model.shared.weight"} == all_names
    assert not [k for k in tensors if "pos" in k.lower() or "sinus" in k.lower()]
    assert len(tensors) == len(list(model.parameters()))  # unique parameters, each stored once


@pytest.mark.parametrize("loader", [VaswaniForConditionalGeneration, AutoModelForSeq2SeqLM], ids=lambda c: c.__name__)
def test_reload_lm_gives_identical_logits_and_keeps_tie(model, saved, batch, loader):
    """Reloaded LM: same class, no missing/unexpected keys, bitwise-equal logits, tie intact."""
    reloaded, info = loader.from_pretrained(saved, output_loading_info=True)
    reloaded.eval()
    assert type(reloaded) is VaswaniForConditionalGeneration
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_tied(reloaded)
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model(**batch).logits)


def test_reload_with_auto_model_gives_base_model(model, saved, batch):
    """AutoModel on the LM checkpoint builds VaswaniModel with the same decoder states and a shared embedding."""
    base, info = AutoModel.from_pretrained(saved, output_loading_info=True)
    base.eval()
    assert type(base) is VaswaniModel
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert base.encoder.embed_tokens.weight is base.shared.weight
    assert base.decoder.embed_tokens.weight is base.shared.weight
    assert torch.equal(base.shared.weight, model.model.shared.weight)
    with torch.no_grad():
        assert torch.equal(base(**batch).last_hidden_state, model.model(**batch).last_hidden_state)


def test_reload_config_with_auto_config(model, saved):
    config = AutoConfig.from_pretrained(saved)
    assert type(config) is VaswaniConfig
    for key in (*TINY, "label_smoothing", "activation_function", "pad_token_id", "decoder_start_token_id"):
        assert getattr(config, key) == getattr(model.config, key), key
    assert config.tie_word_embeddings is True


def test_generation_config_round_trip(saved, tmp_path):
    """The paper's decoding settings are saved, and edited settings are read back from the file, not re-defaulted."""
    loaded = VaswaniForConditionalGeneration.from_pretrained(saved).generation_config
    standalone = GenerationConfig.from_pretrained(saved)
    for config in (loaded, standalone):
        assert config.num_beams == 4
        assert config.length_penalty == 0.6
        assert config.length_penalty_rule == "gnmt"
        assert config.max_length_over_source == 50

    edited = make_model()
    edited.generation_config.update(
        num_beams=2, length_penalty=1.0, length_penalty_rule="transformers", max_length_over_source=7
    )
    edited.save_pretrained(tmp_path)
    config = VaswaniForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (config.num_beams, config.length_penalty) == (2, 1.0)
    assert config.length_penalty_rule == "transformers"
    assert config.max_length_over_source == 7


def test_bfloat16_load_and_save_keep_tie(model, saved, batch, tmp_path):
    """dtype=bfloat16 on load casts every weight and keeps the tie; a bf16 save stores bf16 once and reloads equal."""
    bf16 = VaswaniForConditionalGeneration.from_pretrained(saved, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert_tied(bf16)
    assert torch.equal(bf16.model.shared.weight, model.model.shared.weight.to(torch.bfloat16))

    bf16.save_pretrained(tmp_path)
    tensors = stored_tensors(tmp_path)
    assert {dtype for _, dtype in tensors.values()} == {"BF16"}
    assert sum(shape == (TINY["vocab_size"], TINY["d_model"]) for shape, _ in tensors.values()) == 1
    again = VaswaniForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert_tied(again)
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, bf16(**batch).logits)


CHILD = """
    import json, sys

    folder, payload = sys.argv[1], json.loads(sys.argv[2])

    import torch
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    ids = torch.tensor(payload["input_ids"])
    mask = torch.tensor(payload["attention_mask"])
    lm = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    out = lm.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True)
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    decoder_ids = torch.tensor(payload["decoder_input_ids"])
    labels = torch.tensor(payload["labels"])
    losses = {}
    for fused in (False, True):  # loss_vaswani.py: the plain loss, and the fused one (training mode, autograd on)
        lm.config.fused_loss = fused
        lm.train(fused)
        losses[str(fused)] = lm(input_ids=ids, attention_mask=mask, labels=labels, epsilon_ls=0.1).loss.item()
    lm.eval()
    with torch.no_grad():
        hidden = base(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids)
        lm.set_cpu_kernel("aten")  # kernels_vaswani.py
        plain_logits = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        lm.set_cpu_kernel("onednn" if torch.backends.mkldnn.is_available() else "aten")
        kernel_logits = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    print("RESULT " + json.dumps({
        "lm_class": type(lm).__name__,
        "lm_module": type(lm).__module__,
        "lm_tied": lm.lm_head.weight is lm.model.shared.weight,
        "base_class": type(base).__name__,
        "base_module": type(base).__module__,
        "tokens": out.sequences.tolist(),
        "sequences_scores": out.sequences_scores.tolist(),
        "hidden": hidden.last_hidden_state.tolist(),
        "losses": losses,
        "kernel_difference": (kernel_logits - plain_logits).abs().max().item(),
        "our_modules": sorted(n for n in sys.modules if n.rpartition(".")[2].endswith("_vaswani")),
    }))
    """


def test_remote_code_without_our_package(model, saved, batch, tmp_path):
    """A fresh process that cannot import our package loads the folder with trust_remote_code and decodes as we do."""
    labels = torch.tensor([[13, 14, 15, 2], [16, 17, 2, -100]])
    payload = {**{k: v.tolist() for k, v in batch.items()}, "labels": labels.tolist()}
    child = run_isolated(CHILD, [str(saved), json.dumps(payload)], tmp_path)

    assert child["lm_class"] == "VaswaniForConditionalGeneration"
    assert child["base_class"] == "VaswaniModel"
    for module in (child["lm_module"], child["base_module"], *child["our_modules"]):
        assert module.startswith("transformers_modules."), module
    # every code file was loaded from the folder's copy (the generation loop ran: beam 4 from generation_config.json)
    assert {module.rpartition(".")[2] for module in child["our_modules"]} >= {
        Path(name).stem for name in modeling_vaswani.code_files()
    }
    assert child["lm_tied"]
    assert model.generation_config.num_beams == 4
    with torch.no_grad():  # the plain loss, here: both of the child's losses equal it (dropout is 0)
        ours_loss = model(**{k: batch[k] for k in ("input_ids", "attention_mask")}, labels=labels, epsilon_ls=0.1).loss
    assert child["losses"]["False"] == pytest.approx(ours_loss.item(), rel=1e-6)
    assert child["losses"]["True"] == pytest.approx(ours_loss.item(), rel=1e-5)
    assert child["kernel_difference"] < 1e-5

    ours = model.generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], return_dict_in_generate=True, output_scores=True
    )
    assert child["tokens"] == ours.sequences.tolist()
    torch.testing.assert_close(torch.tensor(child["sequences_scores"]), ours.sequences_scores)
    with torch.no_grad():
        hidden = model.model(**batch).last_hidden_state
    torch.testing.assert_close(torch.tensor(child["hidden"]), hidden)


def test_gradient_checkpointing_same_loss_and_gradients(batch):
    """In train mode with dropout 0, checkpointing recomputes each layer and changes neither loss nor gradients."""
    model = make_model(p_drop=0.0, attention_dropout=0.0, activation_dropout=0.0).train()
    labels = torch.tensor([[13, 14, 15, 2], [16, 17, 2, -100]])
    calls = []  # checkpointing wraps the layer's forward: count calls of a module inside it
    model.model.encoder.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        calls.clear()
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)

    loss, grads, plain_calls = loss_and_grads()
    model.activation_checkpointing_enable()  # the current name of gradient_checkpointing_enable (deprecated alias)
    assert model.is_activation_checkpointing
    ckpt_loss, ckpt_grads, ckpt_calls = loss_and_grads()

    assert (plain_calls, ckpt_calls) == (1, 2)  # the layer really was recomputed in backward
    assert set(grads) == {n for n, _ in model.named_parameters()}
    assert set(ckpt_grads) == set(grads)
    torch.testing.assert_close(ckpt_loss, loss, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-6, atol=1e-8, msg=name)


def test_seq2seq_trainer_three_steps(tmp_path):
    """Seq2SeqTrainer runs 3 CPU steps on a tiny list dataset: finite loss, every parameter updated, tie kept."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model = make_model(p_drop=0.1)
    pad = model.config.pad_token_id
    examples = [
        {"input_ids": [5, 6, 7, 2], "labels": [8, 9, 2]},
        {"input_ids": [10, 11, 2], "labels": [12, 13, 14, 2]},
        {"input_ids": [15, 16, 17, 18, 2], "labels": [19, 2]},
        {"input_ids": [20, 2], "labels": [21, 22, 2]},
    ]
    dataset = [{**ex, "attention_mask": [1] * len(ex["input_ids"])} for ex in examples]

    def collate(rows):
        def pad_to(key, value):
            width = max(len(r[key]) for r in rows)
            return torch.tensor([r[key] + [value] * (width - len(r[key])) for r in rows])

        return {
            "input_ids": pad_to("input_ids", pad),
            "attention_mask": pad_to("attention_mask", 0),
            "labels": pad_to("labels", -100),
        }

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate)
    result = trainer.train()

    assert result.global_step == 3
    assert math.isfinite(result.training_loss)
    step_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(step_losses) == 3 and all(math.isfinite(x) for x in step_losses)
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unchanged, unchanged
    assert_tied(model)
