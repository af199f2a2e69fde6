"""Scoring models: translation metrics, perplexity, accuracy."""
