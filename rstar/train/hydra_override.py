"""Values on verl's command line, which Hydra parses as overrides (`key=value`)."""

from __future__ import annotations

import re

# what Hydra's override grammar reads back as this same string when unquoted: a path, a URL,
# a name (no `=`, comma, quote, space, bracket or `$`), not a number, bool or null
_PLAIN = re.compile(r"[A-Za-z_/][\w/:.\-+@%~]*")
_SPECIAL = {"true", "false", "null", "nan", "inf"}


def value(text: str) -> str:
    """`text` as a Hydra override value that Hydra reads back as it is: plain where it can be
    (the command stays readable), quoted otherwise. Unquoted, a comma makes a sweep of it and an
    `=` (a storage path's `stage=rl1`) a syntax error. Inside quotes Hydra unescapes backslashes
    only before a quote or the closing one."""
    if _PLAIN.fullmatch(text) and text.lower() not in _SPECIAL:
        return text
    escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", text).replace("'", "\\'")
    return f"'{escaped}'"
