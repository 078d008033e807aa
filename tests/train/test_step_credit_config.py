"""rl.step_credit and the episode hack detectors in the config: on for environment tasks,
refused (naming the fix) for single-turn ones, typos answered with "did you mean"."""

import numpy as np
import pytest

from experiments.configs import default as default_config
from experiments.configs import tool_arith as tool_arith_config
from jaxrl_vr.train.config import PipelineConfig, validate


def config(module, **rl):
    tree = module.get_config("smoke").to_dict()
    tree["rl"].update(rl)
    return PipelineConfig.from_dict(tree)


def test_step_credit_section_on_an_environment_task():
    cfg = config(tool_arith_config, step_credit={"tool_ok": 0.2},
                 rewards={"hack_detectors": ["answer_from_tool", "tool_spam", "empty_turn"], "max_tool_calls": 3})
    validate(cfg)
    np.testing.assert_allclose(cfg.rl.step_credit.coef_n(), [0.0, 0.2, 0.0, 0.0])
    assert cfg.rl.rewards.max_tool_calls == 3 and config(tool_arith_config).rl.step_credit is None


@pytest.mark.parametrize("rl, match", [
    ({"step_credit": {"tool_ok": 0.2}}, "rl.step_credit reads the turns"),
    ({"rewards": {"hack_detectors": ["tool_spam"]}}, r"\['tool_spam'\] read the turns"),
])
def test_episode_parts_on_a_single_turn_task_are_refused(rl, match):
    with pytest.raises(ValueError, match=match):
        validate(config(default_config, **rl))


def test_unknown_detector_says_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'tool_spam'"):
        config(tool_arith_config, rewards={"hack_detectors": ["tool_spm"]})
