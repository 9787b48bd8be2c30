"""Data preparation: tokenize, merge + shuffle, verify, vocab mapping, regeneration."""
