"""Bundled recipes by name (zoo.cli.recipes): `zoo recipes` and `--config NAME` from any folder."""
from __future__ import annotations

import pytest

from tests.conftest import REPO
from zoo.cli import recipes

R = REPO / "recipes"
QUICKSTART = R / "quickstart.yaml"
FIG6 = R / "specialisation" / "fig6_forgetting_vs_similarity.yaml"


def test_a_checkout_reads_its_own_recipes_folder():
    assert recipes.recipes_dir() == R


def test_every_yaml_file_is_a_bundled_recipe_named_by_its_path():
    found = recipes.bundled()
    on_disk = {p.relative_to(R).as_posix()[:-len(".yaml")]: p for p in R.rglob("*.yaml")}
    assert found == on_disk
    assert found["quickstart"] == QUICKSTART and found["specialisation/fig6_forgetting_vs_similarity"] == FIG6


@pytest.mark.parametrize("value, file", [
    ("quickstart", QUICKSTART), ("quickstart.yaml", QUICKSTART), ("recipes/quickstart.yaml", QUICKSTART),
    ("./recipes/quickstart.yaml", QUICKSTART), ("specialisation/fig6_forgetting_vs_similarity", FIG6),
    ("recipes/specialisation/fig6_forgetting_vs_similarity.yaml", FIG6),
])
def test_a_name_resolves_to_the_bundled_file_from_any_folder(in_tmp, value, file):
    assert recipes.resolve_config(value) == str(file)


def test_a_file_that_exists_wins_over_a_bundled_name(in_tmp):
    (in_tmp / "recipes").mkdir()
    for local in ("quickstart.yaml", "recipes/quickstart.yaml"):
        (in_tmp / local).write_text("seed_everything: 1\n")
        assert recipes.resolve_config(local) == local
    # no local file of that exact name (a folder is not a config file): the bundled one
    (in_tmp / "quickstart").mkdir()
    assert recipes.resolve_config("quickstart") == str(QUICKSTART)


@pytest.mark.parametrize("text", ["{trainer: {max_steps: 2}}", "trainer:\n  max_steps: 2", '{"seed_everything": 3}'])
def test_yaml_text_given_to_config_passes_unchanged(in_tmp, text):
    assert recipes.resolve_config(text) == text


def test_an_unknown_name_says_what_config_allows_and_suggests_zoo_recipes(in_tmp):
    with pytest.raises(ValueError) as err:
        recipes.resolve_config("quickstrat")
    message = str(err.value)
    assert message.startswith("--config quickstrat:")
    assert "did you mean quickstart" in message and "zoo recipes" in message and "path of a YAML file" in message


def test_only_config_values_are_resolved_on_the_command_line(in_tmp):
    other = "--model.init_args.relu_checkpoint=lightning_logs/version_0/checkpoints/last.ckpt"
    args = ["fit", "--config", "quickstart", "-c", "recipes/quickstart.yaml",
            "--config=specialisation/fig6_forgetting_vs_similarity", other, "--trainer.max_steps=5"]
    assert recipes.with_bundled_configs(args) == [
        "fit", "--config", str(QUICKSTART), "-c", str(QUICKSTART), f"--config={FIG6}", other, "--trainer.max_steps=5"]


def _header(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text + "seed_everything: 0\n")
    return path


@pytest.mark.parametrize("header, expected", [
    ("# A clean line (Fig. 1).\n#\n# more\n", "A clean line (Fig. 1)."),
    ("#\n#   \n# After blank comment lines\n# Next sentence.\n", "After blank comment lines"),
    # broken off mid-sentence: joined up to the first sentence end of the continuation
    ("# Phase 2 of the run ([H] App. B): a GDLN per k, with the gates\n# found in phase 1. Other things.\n",
     "Phase 2 of the run ([H] App. B): a GDLN per k, with the gates found in phase 1."),
    ("# Depth gates found by k-means\n# ([H] App. B) in each layer.\n", "Depth gates found by k-means ([H] App. B) in each layer."),
    ("seed: 0\n# not a header\n", ""),
])
def test_a_recipe_is_described_by_its_first_comment_line(tmp_path, header, expected):
    assert recipes.description(_header(tmp_path, header)) == expected


def test_a_long_description_is_cut_at_a_word_with_an_ellipsis(tmp_path):
    words = "word " * 40
    text = recipes.description(_header(tmp_path, f"# {words}\n"))
    assert len(text) <= recipes.MAX_DESCRIPTION and text.endswith("word…")


def test_every_bundled_recipe_has_a_one_line_description():
    for name, path in recipes.bundled().items():
        text = recipes.description(path)
        assert 0 < len(text) <= recipes.MAX_DESCRIPTION and "\n" not in text, name


def test_zoo_recipes_lists_names_with_descriptions_and_prints_one(capsys):
    assert recipes.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(recipes.bundled())
    quick = next(line for line in lines if line.split()[0] == "quickstart")
    assert quick.endswith(recipes.description(QUICKSTART))
    assert recipes.main(["quickstart"]) == 0
    assert capsys.readouterr().out == QUICKSTART.read_text()
    assert recipes.main(["--path", "specialisation/fig6_forgetting_vs_similarity.yaml"]) == 0
    assert capsys.readouterr().out.strip() == str(FIG6)
    assert recipes.main(["nope"]) == 2
    assert "no bundled recipe 'nope'" in capsys.readouterr().err


def test_the_cli_takes_recipes_as_a_subcommand_and_reports_an_unknown_name_in_one_line(in_tmp, capsys):
    from zoo.cli import main

    with pytest.raises(SystemExit) as done:
        main(["recipes"])
    assert done.value.code == 0 and "quickstart" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", "quickstrat", "--trainer.max_steps=1"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[0].startswith("--config quickstrat: no such file")
    assert not (in_tmp / "lightning_logs").exists()


def test_fit_runs_a_bundled_recipe_by_name_from_another_folder(in_tmp):
    from zoo.cli import build_cli

    cli = build_cli(["fit", "--config", "quickstart", "--trainer.max_steps=1", "--trainer.enable_progress_bar=false",
                     "--trainer.callbacks=null"])
    assert cli.trainer.global_step > 0 and cli.config["fit"]["model"]["init_args"]["steps_per_batch"] == 10
    assert (in_tmp / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
