"""Pictures: loss curves (and attention maps)."""
