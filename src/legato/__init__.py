"""legato: a PyTorch-native system for training and adapting large language models."""

__version__ = "0.1.0"
