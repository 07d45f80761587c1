"""The policy side: engines, weight sync, losses, trainers."""
