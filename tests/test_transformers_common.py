"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``), run on our classes.

The test code is not in this repository: ``transformers_suite`` downloads the source distribution of the
installed transformers version once and imports its ``tests/test_modeling_common.py`` and
``tests/test_configuration_common.py`` (see that module's docstring). Without access to the package
registry the whole module is skipped, with the reason in the skip message.

The tester follows transformers' own ``MarianModelTester`` (tests/models/marian/test_modeling_marian.py).
"""

import unittest
import warnings

import pytest

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

import transformers_suite

try:
    suite = transformers_suite.load_suite()
except transformers_suite.SuiteUnavailable as err:
    message = f"transformers' common model tests NOT RUN: cannot get transformers' test sources. {err}"
    warnings.warn(message, pytest.PytestWarning, stacklevel=1)
    pytest.skip(message, allow_module_level=True)

ModelTesterMixin = suite.modeling.ModelTesterMixin
GenerationTesterMixin = suite.modeling.GenerationTesterMixin  # our empty stand-in: no generate tests run
ConfigTester = suite.configuration.ConfigTester
ids_tensor = suite.modeling.ids_tensor


@pytest.fixture(scope="module", autouse=True)
def vaswani_in_auto_tables():
    """Let ``ModelTesterMixin`` recognise the base model and the LM head by their class names."""
    with transformers_suite.registered_in_auto_tables(
        VaswaniConfig, base_model=VaswaniModel, seq2seq_lm=VaswaniForConditionalGeneration
    ):
        yield


class VaswaniModelTester:
    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        is_training=True,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4,
        hidden_act="relu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self):
        return VaswaniConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            d_ff=self.intermediate_size,
            h=self.num_attention_heads,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            activation_function=self.hidden_act,
            p_drop=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
        )  # label_smoothing stays at its default 0: `test_encoder_decoder_loss_no_double_shift` checks loss == CE

    def prepare_config_and_inputs(self):
        # Source: no special ids but a final </s>; the decoder side may hold any id, padding included.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        config = self.get_config()
        inputs_dict = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(config.pad_token_id),
            # as MarianModelTester's inputs (its decoder mask is the source mask: nothing of the decoder prompt hidden).
            # With hidden prompt positions, transformers' cache-continuation routes disagree for Marian as for us;
            # tests/test_generation_contracts.py checks that case against Marian directly.
            "decoder_attention_mask": input_ids.ne(config.pad_token_id),
        }
        return config, inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class VaswaniModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    # `GenerationTesterMixin` is only the empty stand-in (see transformers_suite); inheriting it is what
    # `test_generation_tester_mixin_inheritance` requires of a tester whose model can generate.
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    is_encoder_decoder = True
    # transformers runs this check only for models it dates to 2023 or later (by a copyright line); run it anyway:
    # every weight must be initialised by `_init_weights` when loading a checkpoint that lacks it.
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = VaswaniModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VaswaniConfig, d_model=64, d_ff=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class TransformersSuiteTest(unittest.TestCase):
    """Guards against a vacuous pass: the downloaded suite really brings transformers' tests."""

    def test_suite_matches_installed_transformers(self):
        import transformers

        self.assertEqual(suite.version, transformers.__version__)
        self.assertTrue((suite.tests_dir / "test_modeling_common.py").is_file())

    def test_common_tests_were_collected(self):
        common_tests = [name for name in dir(VaswaniModelTest) if name.startswith("test_")]
        self.assertGreater(len(common_tests), 100, "ModelTesterMixin brought almost no tests")
