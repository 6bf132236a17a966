"""Real runs that produce ground truth: the same setup, the same step code, real tensors."""
