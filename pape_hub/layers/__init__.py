from .attention import PositionalAttention, PositionalBlock

__all__ = ["PositionalAttention", "PositionalBlock"]
