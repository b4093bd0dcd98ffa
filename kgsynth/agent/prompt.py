"""The agent's prompts: the system prompt (rendered from ``prompts/agent_system*.j2`` for a tool
set and turn limit, ``prompts/agent_system_isp*.j2`` for the isp set's own turn format,
``prompts/agent_system_sexpr*.j2`` for KBQA-R1's actions, or the one a checkpoint stores) and
the user prompt of a question.

    system_prompt("graphwalker", max_turns=10, style="short")
    user_prompt("who directed Kismet?", ["Kismet"])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kgsynth.agent.config import PROMPT_STYLES, AgentConfig
from kgsynth.agent.protocol import ISP_TOOLSET, MAX_OPERATIONS
from kgsynth.prompts import render

TOOL_HELP = {
    "graphwalker": [
        {
            "usage": 'get_relations("Entity Name")',
            "description": "the entity's relations (outgoing and incoming), most relevant first",
        },
        {
            "usage": 'get_triples("Entity Name", ["relation", ...])',
            "description": "the facts along those relations, by name",
        },
    ],
    "kgr1": [
        {
            "usage": 'get_tail_relations("Entity Name")',
            "description": "relations r with (entity, r, ?)",
        },
        {
            "usage": 'get_head_relations("Entity Name")',
            "description": "relations r with (?, r, entity)",
        },
        {
            "usage": 'get_tail_entities("Entity Name", "relation")',
            "description": "the tails of (entity, relation, ?)",
        },
        {
            "usage": 'get_head_entities("Entity Name", "relation")',
            "description": "the heads of (?, relation, entity)",
        },
    ],
}

# A checkpoint trained on trajectories carries the system prompt it was trained with here;
# eval, RL and free rollouts of that checkpoint use it instead of rendering one.
SYSTEM_PROMPT_FILE = "agent_system_prompt.txt"


def system_prompt(toolset: str = "graphwalker", max_turns: int = 10, style: str = "full") -> str:
    """The agent's system prompt: ``full`` (protocol explained, for any model) or ``short``
    (one line of protocol and tool signatures, for small models trained from scratch)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"system prompt style must be one of {', '.join(PROMPT_STYLES)}")
    name = "agent_system" if style == "full" else "agent_system_short"
    if toolset == ISP_TOOLSET:  # ISP-KGR's format: several operations a step, \boxed{} answers
        name = name.replace("agent_system", "agent_system_isp")
        return render(
            name, tools=tool_help(toolset), max_turns=max_turns, max_operations=MAX_OPERATIONS
        )
    if toolset == "sexpr":  # KBQA-R1's actions: expressions, gated relations, counts
        name = name.replace("agent_system", "agent_system_sexpr")
    return render(name, tools=tool_help(toolset), max_turns=max_turns)


def tool_help(toolset: str) -> list[dict[str, str]]:
    """The tool list a system prompt shows for ``toolset`` (the SPARQL-writing sets keep theirs
    in their modules)."""
    if toolset in TOOL_HELP:
        return TOOL_HELP[toolset]
    if toolset == "knowcoder":
        from kgsynth.agent.toolsets import knowcoder

        return knowcoder.TOOL_HELP
    if toolset == "isp":
        from kgsynth.agent.toolsets import isp

        return isp.TOOL_HELP
    if toolset == "sexpr":
        from kgsynth.agent.toolsets import sexpr_syntax

        return sexpr_syntax.TOOL_HELP
    raise ValueError(f"unknown tool set {toolset!r}")


def agent_system_prompt(cfg: AgentConfig) -> str:
    """The system prompt an agent config asks for: its ``system_text`` (a checkpoint's stored
    prompt) when set, else the one rendered for its tool set, turn limit and style."""
    return cfg.system_text or system_prompt(cfg.toolset, cfg.max_turns, cfg.system_prompt)


def stored_system_prompt(model_dir: str | Path | None) -> str | None:
    """The system prompt a checkpoint folder was trained with, if it stores one."""
    if not model_dir:
        return None
    path = Path(model_dir) / SYSTEM_PROMPT_FILE
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def user_prompt(question: str, topic_names: Sequence[str], reference: str | None = None) -> str:
    # a benchmark question may name no topic entity (GrailQA): say so rather than leave it blank
    topics = ", ".join(topic_names) or "none given (find them in the question)"
    text = f"Question: {question}\nTopic entities: {topics}"
    if reference:
        text += (
            "\n\nA reference action sequence that answers this question (follow it, reasoning "
            f"in your own words):\n{reference}"
        )
    return text
