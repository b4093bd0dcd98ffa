"""``kgsynth synthesize``: questions from walks (GraphWalker Phase 2); trajectories follow."""
