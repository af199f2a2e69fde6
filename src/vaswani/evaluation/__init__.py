"""Scoring text outputs: sacreBLEU and chrF, exact match, perplexity (metrics.py). What a
family's ``vaswani evaluate`` reports is its use class's ``score`` (inference/)."""
