"""Real offline data loaders (DESIGN.md §5). Fetch the data first with ``scripts/fetch_data.sh``."""

from .text import FETCH_COMMAND, email_to_text, load_spam_assassin, stratified_split

__all__ = ["FETCH_COMMAND", "email_to_text", "load_spam_assassin", "stratified_split"]
