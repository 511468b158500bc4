"""URL slugs."""
import re


def slugify(text: str) -> str:
    """Lowercase `text` and join its words with single dashes."""
    text = text.lower()
    return re.sub(r"[^a-z0-9]", "-", text).replace("--", "-")
