"""What the agent talks to and how its turns are read: the text protocol, tool-call parsing,
the KG tool environment (shared by trajectory synthesis, RL rollouts and eval)."""
