"""The command-line arguments shared by the commands (training/common/arguments.py, training/common/files.py): the
decoding flags are one definition that `evaluate` and `translate` parse alike, `--cpu_kernel` offers exactly the
model's kernels, and one check words every "output already exists" refusal. No model is loaded."""

import pytest

from modeling_vaswani.kernels_vaswani import CPU_KERNELS
from training import evaluate, translate
from training.common.arguments import CPU_KERNEL_NAMES, DecodingArguments, parse_command
from training.common.files import output_problem

# the flags each command needs besides the decoding ones, valid and cheap to check (nothing is loaded)
REQUIRED = {
    "evaluate": lambda tmp: ["--model", "m", "--dataset_name", "default", "--output_dir", str(tmp / "eval")],
    "translate": lambda tmp: ["--model", "m"],
}
COMMANDS = {"evaluate": evaluate, "translate": translate}
DECODING_LINES = [
    [],
    ["--num_beams", "1"],
    ["--num_beams", "5", "--length_penalty", "1.0", "--length_penalty_rule", "transformers"],
    ["--max_new_tokens", "64", "--cpu_kernel", "int8"],
    ["--max-length-over-source", "20", "--length_penalty_rule", "gnmt"],  # the hyphenated spelling too
]


def decoding_of(command: str, argv: list[str]) -> DecodingArguments:
    parsed = parse_command(COMMANDS[command].build_parser(), argv)
    (decoding,) = [part for part in parsed if isinstance(part, DecodingArguments)]
    return decoding


@pytest.mark.parametrize("flags", DECODING_LINES)
def test_evaluate_and_translate_parse_the_decoding_flags_alike(flags, tmp_path):
    """The same flags give the same DecodingArguments and the same `generate` overrides in both commands; unset
    flags are left out, so the model's generation config decides."""
    ours = {name: decoding_of(name, [*REQUIRED[name](tmp_path), *flags]) for name in COMMANDS}
    assert ours["evaluate"] == ours["translate"]
    overrides = ours["evaluate"].generate_overrides()
    assert "cpu_kernel" not in overrides  # set on the model when it loads, not a generate argument
    given = {flag.lstrip("-").replace("-", "_") for flag in flags if flag.startswith("--")} - {"cpu_kernel"}
    assert set(overrides) == given


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num_beams", "0"], "error: --num_beams must be a positive integer, got 0"),
        (["--max_new_tokens", "-1"], "error: --max_new_tokens must be a positive integer, got -1"),
        (["--max_length_over_source", "0"], "error: --max_length_over_source must be a positive integer, got 0"),
    ],
)
def test_a_bad_decoding_flag_gets_the_same_message_from_both_commands(flags, message, tmp_path):
    for name, command in COMMANDS.items():
        with pytest.raises(SystemExit) as refused:
            command.main([*REQUIRED[name](tmp_path), *flags])
        assert refused.value.code == message, name


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_kernel_or_rule_is_a_usage_error(command, tmp_path, capsys):
    for flags in (["--cpu_kernel", "fast"], ["--length_penalty_rule", "fairseq"]):
        with pytest.raises(SystemExit) as refused:
            COMMANDS[command].main([*REQUIRED[command](tmp_path), *flags])
        assert refused.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_cpu_kernel_choices_are_the_models_kernels():
    """--cpu_kernel's names are spelled in arguments.py (importing the model loads torch, which --help must not);
    they must be the model's CPU_KERNELS, in order, in both commands' parsers and help."""
    assert CPU_KERNEL_NAMES == tuple(CPU_KERNELS)
    for command in COMMANDS.values():
        parser = command.build_parser()
        (action,) = [a for a in parser._actions if a.dest == "cpu_kernel"]
        assert tuple(action.choices) == tuple(CPU_KERNELS)
        assert "{" + ",".join(CPU_KERNELS) + "}" in parser.format_help()


def test_output_problem_words_every_refusal_alike(tmp_path):
    folder, file = tmp_path / "out", tmp_path / "out.txt"
    assert output_problem(folder, "--output_dir", overwrite=False) is None  # missing: it will be made
    folder.mkdir()
    assert output_problem(folder, "--output_dir", overwrite=False) is None  # empty
    (folder / "x").write_text("x")
    assert output_problem(folder, "--output_dir", overwrite=False) == (
        f"--output_dir {folder} exists and is not empty: pass --overwrite to replace it"
    )
    assert output_problem(folder, "--output_dir", overwrite=True) is None
    assert output_problem(folder, "--output", overwrite=True, kind="file") == f"--output {folder} is a folder"
    file.write_text("")
    assert output_problem(file, "--output", overwrite=False, kind="file") is None  # an empty file is no loss
    assert output_problem(file, "--output_dir", overwrite=True) == f"--output_dir {file} is a file"
    file.write_text("mine")
    assert output_problem(file, "--output", overwrite=False, kind="file") == (
        f"--output {file} exists and is not empty: pass --overwrite to replace it"
    )


def test_positional_folders_and_repeated_flags_parse_as_documented():
    """`average RUN`, `publish FOLDER` stay positional next to the dataclasses' flags; `--scores` repeats (each
    kept, in order); a boolean flag can be switched off by value (`--dry_run false`)."""
    from pathlib import Path

    from training import average, publish

    args, rest = parse_command(average.build_parser(), ["runs/base", "--last", "5", "--output_dir", "runs/avg5"])
    assert (rest.run, args.last, args.output_dir, args.overwrite) == (Path("runs/base"), 5, Path("runs/avg5"), False)
    argv = ["runs/avg", "--repo_id", "u/m", "--dry_run", "--scores", "a=x.json", "--scores", "b=y.json"]
    args, rest = parse_command(publish.build_parser(), argv)
    assert (rest.folder, args.dry_run, args.scores) == (Path("runs/avg"), True, ["a=x.json", "b=y.json"])
    args, _ = parse_command(publish.build_parser(), ["runs/avg", "--repo_id", "u/m", "--dry_run", "false"])
    assert args.dry_run is False and args.scores == []
