"""What the agent talks to and how its turns are read and run (shared by trajectory synthesis,
RL rollouts and eval):

- ``config``: :class:`AgentConfig`, the agent's settings declared once (``ToolConfig`` is it).
- ``protocol``: every tag and fixed message of the text protocol, and the turn parser.
- ``prompt``: the system and user prompts.
- ``toolcall`` / ``tools``: tool-call parsing and the KG tool environment.
- ``episode``: the episode and turn records, and :func:`step`, which applies one turn.
- ``loop``: the one turn loop (:func:`run_turns`) with an LLM client as its policy.
- ``rollout``: the token-space policy for RL (ids, loss mask, log-probs).
- ``engines``: what samples a turn's tokens for it: batched HF ``generate`` or a colocated vLLM.
- ``tree``: ISP-KGR's tree rollouts in token space (branching, pruning, bounds).
- ``render``: the one chat template, and messages -> token ids and loss mask for SFT.
- ``rerank`` / ``relrank``: LLM rerank and sentence-encoder ranking of relations.
"""
