"""Models and tokenizers: the tiny locally-built policy of the embedded default."""
