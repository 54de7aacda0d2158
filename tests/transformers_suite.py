"""Run transformers' own common model tests against the classes of this repository.

transformers ships its shared model tests (``ModelTesterMixin`` in ``tests/test_modeling_common.py``,
``ConfigTester`` in ``tests/test_configuration_common.py``) in its source distribution only, not in the
wheel. This helper makes them importable without copying them into this repository:

1. Download. ``pip download --no-binary :all: --no-deps transformers==<installed version>`` fetches
   the sdist of exactly the installed transformers version from the package registry, once. Its
   ``tests/`` directory (and ``PKG-INFO``) is unpacked into a temporary directory beside the cache
   entry, which is then renamed into place, so an interrupted run never leaves a half-filled cache.
   The cache lives in ``$VASWANI_TEST_CACHE/transformers-<version>/`` (default root:
   ``~/.cache/vaswani-tests``) and is reused by later runs.
2. Import. The sdist's ``tests/`` directory is imported as the package ``_transformers_sdist_tests``
   (not ``tests``, which would clash with this repository's own test directory). The sdist lacks three
   modules those two files import relatively; the helper puts stand-ins written here into
   ``sys.modules`` instead:

   * ``.exporters.test_export.ExportTesterMixin``: empty mixin (the ``torch.export`` tests are not run);
   * ``.generation.test_utils.GenerationTesterMixin``: empty mixin (no ``generate`` tests are run;
     ``ModelTesterMixin.test_generation_tester_mixin_inheritance`` only checks that a tester of a
     generative model inherits from it);
   * ``.utils.test_configuration_utils.config_common_kwargs``: a non-default value for every field
     of the base ``PreTrainedConfig`` (used by ``ConfigTester.check_config_arguments_init``).

   ``ConfigTester``'s module also calls ``direct_transformers_import(<tests dir>)``, which executes
   ``<tests dir>/__init__.py``, so the unpacking step writes an empty one there.
3. Register. ``ModelTesterMixin`` decides what a model class is by looking its class name (or its config
   class) up in transformers' Auto tables; registering Auto classes alone does not fill the name tables.
   :func:`registered_in_auto_tables` adds a model type for the duration of a ``with`` block and then
   removes exactly what it added. It fills:

   * ``transformers.models.auto.modeling_auto.MODEL_MAPPING_NAMES[model_type]`` = base model class name.
     Consulted to tell the base (headless, loss-less) model apart: ``test_training`` and
     ``test_training_gradient_checkpointing*`` skip it, ``test_inputs_embeds_matches_input_ids`` and
     ``test_model_forward_default_config_values`` run only on it, and
     ``test_base_model_prefix_loads_base_weights`` reads ``MODEL_MAPPING_NAMES[model_type]``.
   * ``...modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES[model_type]`` = LM head class name.
     Consulted by ``_prepare_for_class(return_labels=True)`` to add ``labels`` of shape ``(batch, seq)``
     (``test_training*``, ``test_model_outputs_equivalence``, ...) and by
     ``test_encoder_decoder_loss_no_double_shift`` to find the model with an LM head.
   * the lazy Auto mappings, through their public ``register`` methods: ``CONFIG_MAPPING``
     (``AutoConfig.register``), ``MODEL_MAPPING`` (``AutoModel.register``, read by
     ``test_torch_save_load``) and ``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING``
     (``AutoModelForSeq2SeqLM.register``). transformers has no ``unregister``; on exit the entries are
     popped from the mappings' ``_extra_content`` dicts.

   The other name tables ``test_modeling_common.py`` consults (multiple choice, question answering,
   sequence/token/image/audio/video classification, causal LM, masked LM, CTC, pretraining, image-text-
   to-text, backbone, semantic segmentation, speech seq2seq, ...) describe heads this model does not
   have, so nothing is added to them.

If the registry cannot be reached (or has no sdist for the installed version), :func:`load_suite`
raises :class:`SuiteUnavailable`; the test module turns that into a loud module-level ``pytest.skip``.

4. The real generation suite, by hand. The sdist lacks ``tests/generation/test_utils.py``
   (``GenerationTesterMixin``) and ``tests/exporters/test_export.py``; a checkout of transformers'
   repository has them, but CI cannot fetch one. ``VASWANI_UPSTREAM_TESTS=<checkout>/tests`` makes
   :func:`load_suite` import those two modules from there instead of the stand-ins (they import each other
   as ``tests.…``, which is aliased to the checkout while they load), so ``tests/test_transformers_common.py``
   then runs the whole upstream ``GenerationTesterMixin`` against our model. CI runs our own equivalents
   (tests/test_generation_contracts.py) instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "_transformers_sdist_tests"
CACHE_ENV = "VASWANI_TEST_CACHE"
UPSTREAM_ENV = "VASWANI_UPSTREAM_TESTS"  # a transformers checkout's tests/ directory (point 4 above)
UPSTREAM_MODULES = ("exporters.test_export", "generation.test_utils")  # in import order
DOWNLOAD_TIMEOUT_S = 600

# Stand-ins for the modules the sdist lacks: {module path below PACKAGE: {attribute: value}}.


class ExportTesterMixin:
    """Stand-in for ``tests/exporters/test_export.py``: contributes no tests."""


class GenerationTesterMixin:
    """Stand-in for ``tests/generation/test_utils.py``: contributes no tests."""


# Every field of the base ``PreTrainedConfig`` with a value different from its default.
config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}

STAND_INS = {
    "exporters.test_export": {"ExportTesterMixin": ExportTesterMixin},
    "generation.test_utils": {"GenerationTesterMixin": GenerationTesterMixin},
    "utils.test_configuration_utils": {"config_common_kwargs": config_common_kwargs},
}

# Role of a model class -> (name table in transformers.models.auto.modeling_auto, Auto class).
AUTO_TABLES = {
    "base_model": ("MODEL_MAPPING_NAMES", "AutoModel"),
    "seq2seq_lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
}


class SuiteUnavailable(RuntimeError):
    """transformers' test sources could not be obtained (registry unreachable, unknown version, ...)."""


@dataclass(frozen=True)
class Suite:
    """transformers' common test modules, imported from the sdist of the installed version."""

    version: str
    tests_dir: Path
    modeling: types.ModuleType  # tests/test_modeling_common.py: ModelTesterMixin, ids_tensor, ...
    configuration: types.ModuleType  # tests/test_configuration_common.py: ConfigTester


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vaswani-tests")


def _download_sdist(version: str, dest: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-binary", ":all:", "--no-deps",
        "--dest", str(dest), "--retries", "2", "--timeout", "30", "--disable-pip-version-check",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SuiteUnavailable(f"`{' '.join(command)}` did not complete: {err}") from err
    tarballs = sorted(dest.glob(f"transformers-{version}.tar.gz"))
    if result.returncode != 0 or not tarballs:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise SuiteUnavailable(
            f"could not download the transformers {version} source distribution "
            f"(`{' '.join(command)}` exited with {result.returncode}):\n{tail}"
        )
    return tarballs[0]


def _unpack_tests(tarball: Path, version: str, dest: Path) -> Path:
    """Extract ``tests/`` and ``PKG-INFO`` of the sdist into ``dest``; return the unpacked root."""
    top = f"transformers-{version}"

    def wanted(member: tarfile.TarInfo) -> bool:
        path = Path(member.name)
        inside = path.parts[:2] == (top, "tests") or path == Path(top, "PKG-INFO")
        return inside and ".." not in path.parts and (member.isfile() or member.isdir())

    try:
        with tarfile.open(tarball) as tar:
            members = [member for member in tar.getmembers() if wanted(member)]
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except tarfile.TarError as err:
        raise SuiteUnavailable(f"cannot unpack {tarball.name}: {err}") from err
    root = dest / top
    if not (root / "tests" / "test_modeling_common.py").is_file():
        raise SuiteUnavailable(f"{tarball.name} has no tests/test_modeling_common.py")
    # Executed by `direct_transformers_import` in test_configuration_common.py.
    (root / "tests" / "__init__.py").touch()
    return root


def _is_complete(tests_dir: Path) -> bool:
    return (tests_dir / "__init__.py").is_file() and (tests_dir / "test_modeling_common.py").is_file()


def ensure_tests_dir(version: str) -> Path:
    """Return the sdist's ``tests/`` directory for ``version``, downloading it on first use."""
    target = cache_root() / f"transformers-{version}"
    tests_dir = target / "tests"
    if _is_complete(tests_dir):
        return tests_dir
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
            tarball = _download_sdist(version, Path(tmp) / "download")
            root = _unpack_tests(tarball, version, Path(tmp) / "unpacked")
            try:
                root.rename(target)  # atomic: the cache entry appears complete or not at all
            except OSError:
                if not _is_complete(tests_dir):  # else another process finished first: use its copy
                    raise
    except SuiteUnavailable as err:
        raise SuiteUnavailable(
            f"{err}\nTo run these tests offline, place the tests/ directory of the transformers {version} sdist "
            f"at {tests_dir} with an empty __init__.py added (${CACHE_ENV} sets the cache root)."
        ) from err.__cause__
    return tests_dir


def _install_stand_ins() -> None:
    for dotted, attributes in STAND_INS.items():
        name = PACKAGE
        for part in dotted.split("."):
            parent, name = sys.modules[name], f"{name}.{part}"
            if name not in sys.modules:
                module = types.ModuleType(name, f"Stand-in written by {__name__}.")
                module.__path__ = []  # a package, so that deeper stand-ins can hang below it
                sys.modules[name] = module
                setattr(parent, part, module)
        vars(sys.modules[name]).update(attributes)


def _import_upstream(upstream: Path) -> None:
    """Import UPSTREAM_MODULES from a checkout's tests/ as submodules of PACKAGE, replacing the stand-ins."""
    if not all((upstream / (dotted.replace(".", "/") + ".py")).is_file() for dotted in UPSTREAM_MODULES):
        raise SuiteUnavailable(f"${UPSTREAM_ENV}={upstream} lacks one of {UPSTREAM_MODULES} (as .py files)")
    aliased = [name for name in sys.modules if name == "tests" or name.startswith("tests.")]
    if aliased:
        raise SuiteUnavailable(f"cannot alias `tests` to {upstream}: {aliased[0]} is already imported")
    try:
        sys.modules["tests"] = sys.modules[PACKAGE]
        for dotted in UPSTREAM_MODULES:
            package, _, leaf = f"{PACKAGE}.{dotted}".rpartition(".")
            spec = importlib.util.spec_from_file_location(
                f"{package}.{leaf}", upstream / (dotted.replace(".", "/") + ".py")
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = sys.modules[f"tests.{dotted}"] = module
            sys.modules[f"tests.{dotted.rpartition('.')[0]}"] = sys.modules[package]
            setattr(sys.modules[package], leaf, module)
            spec.loader.exec_module(module)
    finally:
        for name in [name for name in sys.modules if name == "tests" or name.startswith("tests.")]:
            del sys.modules[name]


def _import_package(tests_dir: Path) -> None:
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        PACKAGE, tests_dir / "__init__.py", submodule_search_locations=[str(tests_dir)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)


def load_suite() -> Suite:
    """Download (once), import and return transformers' common test modules for the installed version."""
    version = importlib.metadata.version("transformers")
    tests_dir = ensure_tests_dir(version)
    _import_package(tests_dir)
    _install_stand_ins()
    if os.environ.get(UPSTREAM_ENV):
        _import_upstream(Path(os.environ[UPSTREAM_ENV]))
    with warnings.catch_warnings():
        # The sdist's pytest markers (flash_attn_test, ...) are registered in its pyproject.toml, not here.
        with contextlib.suppress(ImportError):
            from _pytest.warning_types import PytestUnknownMarkWarning

            warnings.simplefilter("ignore", PytestUnknownMarkWarning)
        modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
        configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return Suite(version, tests_dir, modeling, configuration)


@contextlib.contextmanager
def registered_in_auto_tables(config_class, **model_classes):
    """Make transformers' Auto tables know ``config_class.model_type`` inside the ``with`` block.

    ``model_classes`` maps a role of :data:`AUTO_TABLES` (``base_model``, ``seq2seq_lm``) to a model class.
    Entries that already exist (e.g. for a model shipped with transformers) are left alone; on exit,
    exactly the entries added here are removed again.
    """
    from transformers import AutoConfig
    from transformers.models import auto
    from transformers.models.auto import configuration_auto, modeling_auto

    model_type = config_class.model_type
    undo = []
    try:
        if model_type not in configuration_auto.CONFIG_MAPPING:
            AutoConfig.register(model_type, config_class)
            undo.append(lambda: configuration_auto.CONFIG_MAPPING._extra_content.pop(model_type, None))
        for role, model_class in model_classes.items():
            table_name, auto_class_name = AUTO_TABLES[role]
            table = getattr(modeling_auto, table_name)
            if model_type not in table:
                table[model_type] = model_class.__name__
                undo.append(lambda table=table: table.pop(model_type, None))
            elif model_class.__name__ not in auto.get_values({model_type: table[model_type]}):
                raise ValueError(f"{table_name}[{model_type!r}] is already {table[model_type]!r}")
            mapping = getattr(auto, auto_class_name)._model_mapping
            if config_class not in mapping:
                mapping.register(config_class, model_class, exist_ok=True)
                undo.append(lambda mapping=mapping: mapping._extra_content.pop(config_class, None))
        yield
    finally:
        for action in reversed(undo):
            action()
