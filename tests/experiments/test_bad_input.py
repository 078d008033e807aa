"""Bad input to `python -m experiments.train`: one `error:` line naming the key, the value and
the fix, exit status 2, before the workdir is written (or leaving it reusable: the corrected
command then runs in it); an interrupt at start-up is one `stopped:` line and exit 130."""

import json
import os
import signal
import subprocess
import sys

import pytest

from experiments.config_files import build_config, split_override
from experiments.configs import default as default_config
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.pipeline import report_title, run_pipeline
from jaxrl_vr.train.sources import export_policy, make_builtin_model, make_char_tokenizer
from jaxrl_vr.train.workdir import WorkdirError, prepare_workdir
from test_cli_errors import _error_line, _run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = "--config=experiments/configs/default.py:smoke"
RG_SMOKE = "--config=experiments/configs/smollm2_rg.py:smoke"


def _jsonl(path, prompts) -> str:
    with open(path, "w") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"prompt": prompt, "answer": str(i)}) + "\n")
    return str(path)


def _inputs(tmp_path) -> dict:
    """name -> (config flag, overrides, words the error line must hold)."""
    ten = _jsonl(tmp_path / "ten.jsonl", [f"What is {i}+1?" for i in range(10)])  # none hashes into the 10 %
    empty = _jsonl(tmp_path / "empty.jsonl", [])
    dup = _jsonl(tmp_path / "dup.jsonl", [f"What is {i % 20} + 1?" for i in range(40)])
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\xde\xad\xbe\xef" * 64)
    return {
        "ten_rows_no_eval_path": (RG_SMOKE, ("--config.task.name=jsonl", f"--config.task.path={ten}"),
                                  ("held-out", "task.eval_path", "task.eval_fraction=0.1")),
        "empty_file": (RG_SMOKE, ("--config.task.name=jsonl", f"--config.task.path={empty}"),
                       ("task.path", "is empty")),
        "missing_file": (RG_SMOKE, ("--config.task.name=jsonl", f"--config.task.path={tmp_path / 'no.jsonl'}"),
                         ("task.path", "does not exist")),
        "duplicate_prompts": (RG_SMOKE, ("--config.task.name=jsonl", f"--config.task.path={dup}",
                                          f"--config.task.eval_path={dup}"),
                              ("task.path", "dup.jsonl:line 21", "line 1", "duplicate")),
        "eval_path_overlaps_path": (RG_SMOKE, ("--config.task.name=jsonl", f"--config.task.path={ten}",
                                               f"--config.task.eval_path={ten}"),
                                    ("task.eval_path", "ten.jsonl", "shares 4 of its 4",
                                     "task.allow_eval_overlap=True")),
        "directory_as_gguf": (SMOKE, ("--config.model.source=gguf", f"--config.model.path={tmp_path / 'a_dir'}"),
                              ("model.path", "a_dir", "is a directory", "GGUF file")),
        "garbage_gguf": (RG_SMOKE, ("--config.model.source=gguf", f"--config.model.path={tmp_path / 'bad.gguf'}"),
                         ("model.path", "bad.gguf", "version", "download it again")),
        "missing_gguf": (SMOKE, ("--config.model.source=gguf", f"--config.model.path={tmp_path / 'no.gguf'}"),
                         ("model.path", "no.gguf", "does not exist")),
        "missing_hf_directory": (SMOKE, ("--config.model.source=hf", f"--config.model.path={tmp_path / 'no_hf'}"),
                                 ("model.path", "no_hf", "does not exist")),
        "reasoning_gym_typo": (RG_SMOKE, ("--config.task.rg_tasks=chain_sun",),
                               ("task.rg_tasks", "chain_sun", "did you mean 'chain_sum'")),
        "negative_learning_rate": (SMOKE, ("--config.optim.learning_rate=-1e-4",),
                                   ("optim.learning_rate", "> 0", "-0.0001")),
    }


NAMES = ("ten_rows_no_eval_path", "empty_file", "missing_file", "duplicate_prompts", "eval_path_overlaps_path",
         "directory_as_gguf", "garbage_gguf", "missing_gguf", "missing_hf_directory", "reasoning_gym_typo",
         "negative_learning_rate")


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_named_with_its_fix_before_the_workdir_is_touched(tmp_path, name):
    config, overrides, words = _inputs(tmp_path)[name]
    workdir = tmp_path / "run"
    with pytest.raises(ValueError) as info:  # the CLI prints it as one line, exit 2 (below)
        cfg = build_config(config.removeprefix("--config="), [split_override(o) for o in overrides])
        run_pipeline(cfg, str(workdir), log=lambda line: None)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert not workdir.exists()


@pytest.mark.parametrize("name", ["ten_rows_no_eval_path", "duplicate_prompts", "eval_path_overlaps_path",
                                  "garbage_gguf", "missing_hf_directory", "reasoning_gym_typo"])
def test_bad_input_on_the_command_line_is_one_line_and_exit_2(tmp_path, name):
    config, overrides, words = _inputs(tmp_path)[name]
    workdir = tmp_path / "run"
    line = _error_line(_run(config, f"--workdir={workdir}", *overrides))
    for word in words:
        assert word in line, (word, line)
    assert not workdir.exists()


def _hf_directory_without_chat_template(path) -> str:
    """A tiny untrained builtin decoder exported as an HF directory (no chat template)."""
    cfg = PipelineConfig()
    tokenizer = make_char_tokenizer()
    return export_policy(make_builtin_model(cfg, tokenizer), tokenizer, str(path))


@pytest.mark.slow
def test_chat_without_a_template_names_the_fix_and_the_corrected_command_reuses_the_workdir(tmp_path):
    model = _hf_directory_without_chat_template(tmp_path / "hf")
    workdir = tmp_path / "run"
    args = (SMOKE, f"--workdir={workdir}", "--config.model.source=hf", f"--config.model.path={model}",
            "--config.rl.steps=0", "--config.eval.base_calibration_samples=0", "--config.task.num_eval=4",
            "--config.run.export=False", "--config.run.tensorboard=False")
    line = _error_line(_run(*args, "--config.model.chat=True"))
    assert "model.chat=True" in line and "model.chat=False" in line and "chat template" in line
    assert os.listdir(workdir) == ["config.json"]  # the model was loaded: the check comes before any forward
    corrected = _run(*args)  # model.chat=False: the workdir takes it
    assert corrected.returncode == 0, corrected.stderr[-3000:]
    assert "stopped before its first step" in corrected.stdout and "model.chat" in corrected.stdout
    with open(workdir / "config.json") as f:
        assert json.load(f)["model"]["chat"] is False
    assert (workdir / "summary.json").is_file()


def test_a_workdir_takes_a_new_config_only_until_a_step_is_done(tmp_path):
    tree = PipelineConfig().to_dict()
    changed = PipelineConfig.from_dict({"optim": {"learning_rate": 1e-4}}).to_dict()
    workdir = str(tmp_path / "run")
    assert prepare_workdir(workdir, tree).replaced == ""
    replaced = prepare_workdir(workdir, changed).replaced  # nothing done yet: the new config wins
    assert "optim.learning_rate: workdir has 0.001, config has 0.0001" in replaced
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))  # a step is done: the config is kept
    with pytest.raises(WorkdirError, match="optim.learning_rate"):
        prepare_workdir(workdir, tree)


_SLOW_SOURCE_CONFIG = '''
import sys
import time

from experiments.configs import default
from jaxrl_vr.train.sources import MODEL_SOURCES


def slow_model(cfg, workdir, data, log):
    print("loading the model", flush=True)
    time.sleep(120)


MODEL_SOURCES["slow"] = slow_model


def get_config(arg=None):
    config = default.get_config("smoke")
    config.model.source = "slow"
    return config
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_model_load_is_one_line_and_exit_130(tmp_path, sig):
    config = tmp_path / "slow.py"
    config.write_text(_SLOW_SOURCE_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # SIGINT as a terminal delivers it: a pytest started with SIGINT ignored (nohup, a
    # background job, some CI runners) would pass the ignore on, and the CLI keeps it.
    proc = subprocess.Popen([sys.executable, "-m", "experiments.train", f"--config={config}",
                             f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:  # the lines before the model source's own
        if line.strip() == "loading the model":
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped: interrupted by " + sig.name), err[-3000:]


@pytest.mark.parametrize("module, flag", [("experiments.train", "--help"), ("experiments.train", "-h"),
                                          ("experiments.evaluate", "-h"), ("experiments.compare", "--help")])
def test_help_exits_0_with_the_flags(module, flag):
    proc = _run(flag, module=module)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--workdir" in proc.stdout or "--root" in proc.stdout
    assert proc.stderr.strip() == "", proc.stderr[-3000:]


def test_report_title_names_the_model_and_the_data_file():
    tree = default_config.get_config("smoke").to_dict()
    tree["model"].update(source="gguf", path="/models/model.Q8_0.gguf")
    tree["task"].update(name="jsonl", path="/data/train.jsonl", eval_path="/data/test.jsonl")
    assert report_title(PipelineConfig.from_dict(tree)) == (
        "jaxrl_vr: model.Q8_0.gguf on train.jsonl (held out: test.jsonl)")
    assert report_title(PipelineConfig()) == "jaxrl_vr: the builtin decoder on the arithmetic task"


def test_transformers_torch_notice_is_silenced():
    pytest.importorskip("transformers")
    code = ("import importlib.util, sys; import jaxrl_vr, transformers; "
            "sys.exit(3 if importlib.util.find_spec('torch') else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode == 3:
        pytest.skip("torch is installed: transformers prints no notice")
    assert proc.returncode == 0 and "PyTorch was not found" not in proc.stderr, proc.stderr
