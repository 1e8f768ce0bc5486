"""Provides reinforcement-learning post-training parts: GRPO's math, rollouts' environments."""
