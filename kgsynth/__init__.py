"""kgsynth: knowledge graph -> agent training data -> trained KG agents.

Importing the package does nothing: no clients are created and no models are loaded.
"""

__version__ = "0.1.0"
