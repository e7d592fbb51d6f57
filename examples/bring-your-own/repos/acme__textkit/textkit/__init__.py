from textkit.strings import count_words, initials, is_palindrome, shout, snake, truncate

__all__ = ["count_words", "initials", "is_palindrome", "shout", "snake", "truncate"]
__version__ = "0.1.0"
