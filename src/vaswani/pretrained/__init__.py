"""Importing pretrained checkpoints into vaswani's own modules (see ``vaswani import``)."""
