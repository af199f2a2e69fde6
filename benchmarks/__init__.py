"""Side-by-side measurements; run as modules from the repository root (see README)."""
