"""Environments: multi-turn, tool-integrated episodes (`docs/environments.md`)."""

from jaxrl_vr.envs.base import Environment, Message, StepResult, ToolCall
from jaxrl_vr.envs.episodes import EpisodeLimits, EpisodeRunner, Episodes, TurnRecord
from jaxrl_vr.envs.library import ENVIRONMENTS, SingleTurnEnv, ToolEnv, ToolEnvSettings, make_env_factory
from jaxrl_vr.envs.render import Renderer, TemplateError
from jaxrl_vr.envs.tools import TOOLS, PythonSettings, Tool, ToolError, make_tool

__all__ = ["ENVIRONMENTS", "Environment", "EpisodeLimits", "EpisodeRunner", "Episodes", "Message",
           "PythonSettings", "Renderer", "SingleTurnEnv", "StepResult", "TOOLS", "TemplateError", "Tool",
           "ToolCall", "ToolEnv", "ToolEnvSettings", "ToolError", "TurnRecord", "make_env_factory", "make_tool"]
