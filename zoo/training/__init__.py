"""Training utilities: the toy translation corpus, BLEU, and training loops."""
